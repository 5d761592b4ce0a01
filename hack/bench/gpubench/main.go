// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command gpubench measures the GPU copy paths of the xgmi engine beside the
// driver's own copies on GPU 0 and prints one table (see docs/gpu-benchmarks.md).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/fabricxfer/fabricxfer/internal/gpubench"
)

func main() {
	reps := flag.Int("reps", 20, "timed repetitions of the fast methods (median reported)")
	slow := flag.Int("slow-reps", 3, "timed repetitions of per-block and batch driver copies")
	contig := flag.Uint64("contig-mib", 1024, "contiguous copy size in MiB")
	cache := flag.String("cache", "", "directory for compiled kernels")
	only := flag.String("only", "", "run only the scatter case with this block size in bytes (e.g. 720), and no contiguous copy")
	upload := flag.Bool("engine-upload-descriptors", false, "the engine uploads descriptors to device memory instead of letting the kernel read them from pinned host memory")
	contigOnly := flag.Bool("contig-only", false, "run only the contiguous copy")
	skipDriver := flag.Bool("skip-driver", false, "leave out the per-block and batch driver copies")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpubench:", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "gpubench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	cfg := gpubench.Config{
		Reps: *reps, SlowReps: *slow, ContigBytes: *contig << 20, CacheDir: *cache, EngineUploadDescriptors: *upload, SkipDriver: *skipDriver,
		Scatter: []gpubench.ScatterCase{
			{Count: 15360, Size: 720, PoolBlocks: 262144},
			{Count: 4096, Size: 32 << 10, PoolBlocks: 16384},
			{Count: 1024, Size: 256 << 10, PoolBlocks: 2048},
		},
	}
	if *only != "" {
		cfg.ContigBytes = 0
		var keep []gpubench.ScatterCase
		for _, sc := range cfg.Scatter {
			if fmt.Sprint(sc.Size) == *only {
				keep = append(keep, sc)
			}
		}
		cfg.Scatter = keep
	}
	if *contigOnly {
		cfg.Scatter = nil
	}
	if _, err := gpubench.Run(os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "gpubench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
