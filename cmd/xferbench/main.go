// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command xferbench measures fabricxfer's transfer engines against plain baselines in the same run: copy() for
// host memory, a plain Go TCP stream between the same two processes for tcp. See docs/xferbench.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/bytesize"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "peer" {
		if err := runPeer(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "xferbench peer:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "xferbench:", err)
		os.Exit(1)
	}
}

type options struct {
	engine    string
	ops       []string
	peer      string
	sizes     []uint64
	batch     int
	blocks    int
	blockSize uint64
	rc        RunConfig
	conns     int
	chunk     uint64
	hostThr   int
	jsonPath  string
	pngPath   string
	title     string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("xferbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.engine, "engine", "xgmi", "engine to measure: "+strings.Join(modeNames(), ", "))
	op := fs.String("op", "write", "read, write, or both (read,write)")
	fs.StringVar(&o.peer, "peer", "local", "for -engine auto: local (same-node pair) or remote (peer process)")
	sizes := fs.String("sizes", "4KiB,64KiB,1MiB,16MiB,64MiB", "item sizes to sweep, comma-separated (B, KiB, MiB, GiB)")
	fs.IntVar(&o.batch, "batch", 1, "items per transfer (kept apart so they do not coalesce)")
	fs.IntVar(&o.blocks, "blocks", 0, "scattered mode: blocks per transfer, at random offsets (overrides -sizes and -batch)")
	blockSize := fs.String("block-size", "720", "scattered mode: bytes per block")
	fs.IntVar(&o.rc.Threads, "threads", 1, "concurrent submitters, each on its own part of the regions")
	fs.IntVar(&o.rc.MinIters, "iters", 20, "minimum operations per thread per point")
	fs.DurationVar(&o.rc.MinTime, "min-time", 600*time.Millisecond, "minimum measuring time per side per point")
	fs.IntVar(&o.rc.Rounds, "rounds", 3, "alternating engine/baseline rounds per point")
	fs.DurationVar(&o.rc.Timeout, "timeout", 60*time.Second, "deadline of every operation")
	fs.Uint64Var(&o.rc.Seed, "seed", 1, "seed of the scattered offsets")
	fs.IntVar(&o.conns, "conns", 4, "tcp: connections per peer")
	fs.IntVar(&o.hostThr, "host-threads", 0, "xgmi host backend: goroutines per plan (0: GOMAXPROCS)")
	chunk := fs.String("chunk", "4MiB", "tcp: striping chunk")
	fs.StringVar(&o.jsonPath, "json", "", "write results as JSON to this file")
	fs.StringVar(&o.pngPath, "png", "", "write a GB/s plot (engine and baseline per op) to this PNG file")
	fs.StringVar(&o.title, "title", "", "plot title (default: engine and pattern)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*op, ",") {
		if s != "read" && s != "write" {
			return nil, fmt.Errorf("-op %q: want read, write or read,write", *op)
		}
		o.ops = append(o.ops, s)
	}
	var err error
	if o.sizes, err = parseSizes(*sizes); err != nil {
		return nil, fmt.Errorf("-sizes: %w", err)
	}
	if o.blockSize, err = parseSize(*blockSize); err != nil {
		return nil, fmt.Errorf("-block-size: %w", err)
	}
	if o.chunk, err = parseSize(*chunk); err != nil {
		return nil, fmt.Errorf("-chunk: %w", err)
	}
	switch {
	case o.batch < 1, o.blocks < 0, o.rc.Threads < 1, o.rc.MinIters < 1, o.rc.Rounds < 1, o.rc.Timeout <= 0:
		return nil, errors.New("-batch, -threads, -iters, -rounds and -timeout must be positive, -blocks not negative")
	case o.peer != "local" && o.peer != "remote":
		return nil, fmt.Errorf("-peer %q: want local or remote", o.peer)
	}
	return o, nil
}

func (o *options) workloads() []Workload {
	if o.blocks > 0 {
		return []Workload{{Pattern: "scattered", Size: o.blockSize, Batch: o.blocks}}
	}
	var ws []Workload
	for _, s := range o.sizes {
		ws = append(ws, Workload{Pattern: "contiguous", Size: s, Batch: o.batch})
	}
	return ws
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	mode, err := lookupMode(o.engine)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	works := o.workloads()
	var capacity uint64
	for _, w := range works {
		capacity = max(capacity, w.window()*uint64(o.rc.Threads))
	}
	progress := newProgress(stderr, len(works)*len(o.ops))
	var results []*Result
	for _, op := range o.ops {
		t, err := mode.Setup(ctx, SetupConfig{Op: op, Capacity: capacity, Peer: o.peer, Conns: o.conns,
			ChunkBytes: int(o.chunk), Self: self, HostThreads: o.hostThr})
		if err != nil {
			return fmt.Errorf("setting up %s %s: %w", o.engine, op, err)
		}
		for _, w := range works {
			progress.step(fmt.Sprintf("%s %s %s", o.engine, op, workloadLabel(w)))
			r, err := measure(ctx, t, w, op, o.rc)
			if err != nil {
				t.Close()
				return err
			}
			results = append(results, r)
		}
		if err := t.Close(); err != nil {
			return fmt.Errorf("closing %s: %w", o.engine, err)
		}
	}
	progress.done()
	printTable(stdout, o.engine, results)
	if o.jsonPath != "" {
		b, err := json.MarshalIndent(map[string]any{"engine": o.engine, "args": args, "results": results}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if o.pngPath != "" {
		title := o.title
		if title == "" {
			title = fmt.Sprintf("xferbench %s, %s", o.engine, works[0].Pattern)
		}
		if err := writePlot(o.pngPath, title, results); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	return nil
}

func parseSizes(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := parseSize(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// parseSize reads "720", "4Ki", "4KiB", "1MiB", "2GiB" or "2G" (2·10⁹) as every command does (bytesize.Parse),
// at most 1 TiB.
func parseSize(s string) (uint64, error) { return bytesize.Parse(s, 1<<40) }
