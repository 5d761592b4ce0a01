// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/hack/internal/procstat"
)

// sample is one Prometheus counter series: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// parseCounter reads every series of metric name from Prometheus text exposition.
func parseCounter(text []byte, name string) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		s := sample{labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return nil, fmt.Errorf("metric line %q: no closing brace", line)
			}
			if err := parseLabels(rest[1:end], s.labels); err != nil {
				return nil, fmt.Errorf("metric line %q: %w", line, err)
			}
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer metric name with this prefix
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metric line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads a="x",b="y" with Go-style escapes in the values.
func parseLabels(s string, into map[string]string) error {
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return fmt.Errorf("bad label list at %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		val, err := strconv.QuotedPrefix(s[eq+1:])
		if err != nil {
			return fmt.Errorf("label %s: %w", key, err)
		}
		if into[key], err = strconv.Unquote(val); err != nil {
			return fmt.Errorf("label %s: %w", key, err)
		}
		s = strings.TrimPrefix(s[eq+1+len(val):], ",")
	}
	return nil
}

// delta subtracts before from after, series by series, keyed by the listed labels (summing the rest).
func delta(before, after []sample, by ...string) map[string]float64 {
	key := func(s sample) string {
		parts := make([]string, len(by))
		for i, l := range by {
			parts[i] = s.labels[l]
		}
		return strings.Join(parts, " ")
	}
	out := map[string]float64{}
	for _, s := range after {
		out[key(s)] += s.value
	}
	for _, s := range before {
		out[key(s)] -= s.value
	}
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}

// topN lists the n largest entries of m as "key=value/s" with the window's rate.
func topN(m map[string]float64, n int, window time.Duration) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	if len(keys) > n {
		keys = keys[:n]
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s: %.2f/s", strings.TrimSpace(k), m[k]/window.Seconds())
	}
	return out
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// scrape fetches a plain-HTTP metrics endpoint (the operator's).
func scrape(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return body, nil
}

// procMemKiB reads a memory line (VmHWM, VmRSS) of a process's /proc status, in KiB.
func procMemKiB(pid int, field string) (int64, error) {
	st, err := procstat.Status(pid)
	if err != nil {
		return 0, err
	}
	kb, ok := st[field]
	if !ok {
		return 0, fmt.Errorf("process %d status has no %s line", pid, field)
	}
	return kb, nil
}

// latency is one request kind's latency distribution from a Prometheus histogram's buckets over a window.
type latency struct {
	kind          string
	count         float64
	p50, p90, p99 float64 // seconds; +Inf when the quantile lies past the last finite bucket
}

// histogramQuantiles groups the delta of histogram buckets (series name_bucket with an le label) between two
// scrapes by the listed labels and estimates each group's quantiles, interpolating linearly within a bucket as
// Prometheus's histogram_quantile does. keep selects the series that count.
func histogramQuantiles(before, after []sample, keep func(map[string]string) bool, by ...string) []latency {
	filter := func(in []sample) []sample {
		var out []sample
		for _, s := range in {
			if keep(s.labels) {
				out = append(out, s)
			}
		}
		return out
	}
	d := delta(filter(before), filter(after), append(by, "le")...)
	type bucket struct{ le, cum float64 }
	groups := map[string][]bucket{}
	for k, v := range d {
		i := strings.LastIndexByte(k, ' ')
		le, err := strconv.ParseFloat(k[i+1:], 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		groups[k[:i]] = append(groups[k[:i]], bucket{le, v})
	}
	var out []latency
	for kind, bs := range groups {
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		total := bs[len(bs)-1].cum
		if total <= 0 {
			continue
		}
		q := func(p float64) float64 {
			rank, lower, below := p*total, 0.0, 0.0
			for _, b := range bs {
				if b.cum >= rank {
					if b.cum == below {
						return b.le
					}
					return lower + (b.le-lower)*(rank-below)/(b.cum-below)
				}
				lower, below = b.le, b.cum
			}
			return bs[len(bs)-1].le
		}
		out = append(out, latency{kind: strings.TrimSpace(kind), count: total, p50: q(0.5), p90: q(0.9), p99: q(0.99)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].count > out[j].count })
	return out
}

// ms writes seconds as milliseconds, or "> last bucket" for +Inf.
func ms(s float64) string {
	if math.IsInf(s, 1) {
		return "> last bucket"
	}
	return fmt.Sprintf("%.0f ms", s*1000)
}

// process is a process whose CPU time a run reports, by name.
type process struct {
	name string
	pid  int
}

// processes are the processes a run reports, in the order of its line.
type processes []process

// processesOf names the API server, etcd and the operator where their PIDs were given, and this harness.
func processesOf(o options) processes {
	var ps processes
	for _, p := range []process{{"kube-apiserver", o.apiserverPID}, {"etcd", o.etcdPID}, {"operator", o.operatorPID}, {"harness", os.Getpid()}} {
		if p.pid > 0 {
			ps = append(ps, p)
		}
	}
	return ps
}

// cpu reads each process's CPU seconds (NaN where it cannot be read).
func (ps processes) cpu() []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		s, err := procCPUSeconds(p.pid)
		if err != nil {
			s = math.NaN()
		}
		out[i] = s
	}
	return out
}

// report says what each process used between two readings over wall, and the machine's cores over it.
func (ps processes) report(before, after []float64, wall time.Duration) string {
	var parts []string
	total := 0.0
	for i, p := range ps {
		d := after[i] - before[i]
		if !math.IsNaN(d) {
			total += d
		}
		parts = append(parts, fmt.Sprintf("%s %.2f s (%.0f %% of a core)", p.name, d, 100*d/wall.Seconds()))
	}
	return fmt.Sprintf("%s; together %.2f s of the %d cores' %.1f s", strings.Join(parts, ", "), total, runtime.NumCPU(),
		float64(runtime.NumCPU())*wall.Seconds())
}

// procCPUSeconds is the user+system CPU time a process has used, from /proc/<pid>/stat (clock ticks of 1/100 s,
// as Linux reports them to user space).
func procCPUSeconds(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its closing parenthesis start at field 3.
	rest := raw[bytes.LastIndexByte(raw, ')')+1:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0, fmt.Errorf("process %d stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("process %d stat: utime %q stime %q", pid, f[11], f[12])
	}
	return (utime + stime) / 100, nil
}
