// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

func humanSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func workloadLabel(w Workload) string {
	if w.Pattern == "scattered" {
		return fmt.Sprintf("%dx%s scattered", w.Batch, humanSize(w.Size))
	}
	if w.Batch > 1 {
		return fmt.Sprintf("%dx%s", w.Batch, humanSize(w.Size))
	}
	return humanSize(w.Size)
}

func resultLabel(r *Result) string {
	return workloadLabel(Workload{Pattern: r.Pattern, Size: r.ItemSize, Batch: r.Items})
}

func micros(us float64) string {
	d := time.Duration(us * 1e3)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1fus", us)
}

// printTable writes one row per point: the engine's numbers, then the baseline's and the ratio.
func printTable(w io.Writer, engine string, results []*Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "engine\top\tsize\tthreads\tplans/op\tGB/s\tp50\tp99\tops/s\tbaseline\tGB/s\tp50\tratio\t")
	for _, r := range results {
		row := []string{r.Engine, r.Op, resultLabel(r), fmt.Sprint(r.Threads), fmt.Sprint(r.Plans),
			fmt.Sprintf("%.2f", r.GBps), micros(r.P50Us), micros(r.P99Us), fmt.Sprintf("%.0f", r.OpsPerSec)}
		if b := r.Baseline; b != nil {
			row = append(row, b.Name, fmt.Sprintf("%.2f", b.GBps), micros(b.P50Us), fmt.Sprintf("%.2f", r.Ratio))
		} else {
			row = append(row, "-", "-", "-", "-")
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
}

// progress draws a bar on stderr when stderr is a terminal, and nothing otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	n     int
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) step(label string) {
	if !p.tty {
		return
	}
	const width = 30
	filled := width * p.n / max(p.total, 1)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %d/%d %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.n+1, p.total, label)
	p.n++
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
