// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/hack/internal/procstat"
)

// sample is one look at a process. Goroutines is -1 where the process exposes no count.
type sample struct {
	At         time.Time
	RSSKiB     int64
	Threads    int64
	FDs        int64
	Goroutines int64
}

// tolerance is how much a long-lived process may grow from its warm-up baseline: a figure fails only when it
// exceeds both the relative and the absolute allowance, so small processes are not failed for a few KiB and
// large ones not for a few percent.
type tolerance struct {
	RSSFrac       float64
	RSSKiB        int64
	GoroutineFrac float64
	Goroutines    int64
	FDs           int64
}

var defaultTolerance = tolerance{RSSFrac: 0.25, RSSKiB: 20 << 10, GoroutineFrac: 0.10, Goroutines: 20, FDs: 10}

// allowed is the larger of the two allowances over base.
func allowed(base int64, frac float64, abs int64) int64 {
	return base + max(int64(float64(base)*frac), abs)
}

// series is the samples of one process, in time order.
type series struct {
	Name    string
	Samples []sample
}

// window is the element-wise median of the samples in [from, to]: one GC cycle or one burst of connections
// must not decide the outcome.
func (s *series) window(from, to time.Time) (sample, bool) {
	var in []sample
	for _, x := range s.Samples {
		if !x.At.Before(from) && !x.At.After(to) {
			in = append(in, x)
		}
	}
	if len(in) == 0 {
		return sample{}, false
	}
	med := func(f func(sample) int64) int64 {
		v := make([]int64, len(in))
		for i, x := range in {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return sample{At: in[len(in)-1].At,
		RSSKiB:     med(func(x sample) int64 { return x.RSSKiB }),
		Threads:    med(func(x sample) int64 { return x.Threads }),
		FDs:        med(func(x sample) int64 { return x.FDs }),
		Goroutines: med(func(x sample) int64 { return x.Goroutines }),
	}, true
}

// judge compares the median of the span before warmupEnd with the median of the span before end and returns
// both and what grew past the tolerance.
func judge(s *series, warmupEnd, end time.Time, span time.Duration, tol tolerance) (base, last sample, problems []string) {
	base, ok := s.window(warmupEnd.Add(-span), warmupEnd)
	if !ok {
		return base, last, []string{fmt.Sprintf("%s: no sample in the %s before the end of warm-up", s.Name, span)}
	}
	last, ok = s.window(end.Add(-span), end)
	if !ok {
		return base, last, []string{fmt.Sprintf("%s: no sample in the last %s", s.Name, span)}
	}
	if lim := allowed(base.RSSKiB, tol.RSSFrac, tol.RSSKiB); last.RSSKiB > lim {
		problems = append(problems, fmt.Sprintf("%s: RSS grew %d → %d KiB (limit %d)", s.Name, base.RSSKiB, last.RSSKiB, lim))
	}
	if base.Goroutines >= 0 && last.Goroutines >= 0 {
		if lim := allowed(base.Goroutines, tol.GoroutineFrac, tol.Goroutines); last.Goroutines > lim {
			problems = append(problems, fmt.Sprintf("%s: goroutines grew %d → %d (limit %d)", s.Name, base.Goroutines, last.Goroutines, lim))
		}
	}
	if lim := base.FDs + tol.FDs; last.FDs > lim {
		problems = append(problems, fmt.Sprintf("%s: open fds grew %d → %d (limit %d)", s.Name, base.FDs, last.FDs, lim))
	}
	return base, last, problems
}

// procSample reads RSS and threads from /proc/PID/status and counts /proc/PID/fd.
func procSample(pid int) (sample, error) {
	s := sample{At: time.Now(), Goroutines: -1}
	st, err := procstat.Status(pid)
	if err != nil {
		return s, err
	}
	s.RSSKiB, s.Threads = st["VmRSS"], st["Threads"]
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, fmt.Errorf("listing the fds of process %d: %w", pid, err)
	}
	s.FDs = int64(len(fds))
	return s, nil
}

// selfSample is this program's own sample, with the runtime's goroutine count.
func selfSample() (sample, error) {
	s, err := procSample(os.Getpid())
	s.Goroutines = int64(runtime.NumGoroutine())
	return s, err
}

// goroutines reads go_goroutines from a Prometheus text endpoint; -1 when the endpoint has no such metric.
func goroutines(ctx context.Context, hc *http.Client, url string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return -1, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return -1, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return -1, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return -1, fmt.Errorf("reading %s: %w", url, err)
	}
	return parseGoroutines(body), nil
}

// parseGoroutines finds the go_goroutines gauge in Prometheus text; -1 when absent.
func parseGoroutines(text []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "go_goroutines" {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return int64(v)
			}
		}
	}
	return -1
}

// pidFrom reads a PID file.
func pidFrom(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading PID file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("PID file %s: %w", path, err)
	}
	return pid, nil
}
