// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"

	"github.com/fabricxfer/fabricxfer/agent/node"
	"github.com/fabricxfer/fabricxfer/topology/nvml"
)

// standaloneCommand serves the socket and moves bytes on one machine without Kubernetes (node.NewStandalone),
// with defaults for one machine and optional profiles of the whole run. It is how a GPU machine runs the agent
// for development and benchmarks.
func standaloneCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent standalone", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := node.Options{Version: version, Detection: node.DetectionOptions{OpenNVML: nvml.Open}}
	var lf logFlags
	opts.RegisterFlags(fs)
	lf.register(fs)
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile of the whole run to this file (profiling the socket path)")
	traceFile := fs.String("trace", "", "write an execution trace of the whole run to this file (scheduling latency on the socket path)")
	heapProfile := fs.String("heap-profile", "", "write a profile of the memory in use at the end of the run to this file (what the collector marks)")
	// Defaults for one machine: a pool name to find the socket by, no certificates, no health port.
	for name, value := range map[string]string{"pool-namespace": "default", "pool-name": "kv", "tls-dir": "",
		"health-addr": "", "peer-listen": "127.0.0.1:0", "data-listen": "127.0.0.1:0"} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("setting the default of --%s: %w", name, err)
		}
		fs.Lookup(name).DefValue = value // what --help shows
	}
	fs.Usage = func() { standaloneUsage(fs, stderr) }
	if err := fs.Parse(args); err != nil {
		return parseFailed(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent standalone: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	var cluster []string
	fs.Visit(func(f *flag.Flag) {
		if clusterOnly(f.Name) {
			cluster = append(cluster, "--"+f.Name)
		}
	})
	if len(cluster) > 0 {
		fmt.Fprintf(stderr, "agent standalone: %s: only an agent in a cluster (agent run) reads these; standalone has "+
			"no API server, kubelet or report, and would ignore them\n", strings.Join(cluster, ", "))
		return errUsage
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	n, err := node.NewStandalone(ctx, opts, log)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("creating the CPU profile: %w", err)
		}
		defer f.Close()
		// Microsecond calls need more than the default 100 samples a second to show up.
		runtime.SetCPUProfileRate(4000)
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("starting the CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			return fmt.Errorf("creating the trace: %w", err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return fmt.Errorf("starting the trace: %w", err)
		}
		defer trace.Stop()
	}
	if *heapProfile != "" {
		f, err := os.Create(*heapProfile)
		if err != nil {
			return fmt.Errorf("creating the heap profile: %w", err)
		}
		defer f.Close()
		defer func() {
			runtime.GC() // the profile shows memory in use as of the last collection
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				fmt.Fprintf(stderr, "agent standalone: writing the heap profile: %v\n", err)
			}
		}()
	}
	return n.Run(ctx)
}

// clusterOnly reports whether flag name (one of node.Options') means something only to an agent in a cluster:
// standalone refuses it rather than ignore it (--report-only served a socket all the same), and its help leaves it
// out.
func clusterOnly(name string) bool {
	switch name {
	case "kubeconfig", "heartbeat", "report-only", "node-cert",
		"dra", "dra-channels", "dra-host-socket-dir", "cdi-dir", "kubelet-plugin-dir", "kubelet-registry-dir":
		return true
	}
	return false
}

// standaloneUsage lists standalone's flags, leaving out those of an agent in a cluster.
func standaloneUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintln(w, "Usage of agent standalone (flags of an agent in a cluster, such as --kubeconfig and --dra, are agent run's):")
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(w)
	fs.VisitAll(func(f *flag.Flag) {
		if !clusterOnly(f.Name) {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}
