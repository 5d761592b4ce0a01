// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"syscall"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// Mode is one kind of measurement: an engine and the pair of regions it moves between. Modes register
// themselves from init functions, so GPU modes live in their own files (gpu*.go) and are added without
// touching this one. The registry is written only during package initialisation.
type Mode struct {
	// Name is what -engine selects ("xgmi", "tcp", "auto", ...).
	Name        string
	Description string
	// Setup builds the engine and registers a source and a destination of cfg.Capacity bytes each.
	Setup func(ctx context.Context, cfg SetupConfig) (*Target, error)
}

// SetupConfig is what a mode is asked for.
type SetupConfig struct {
	// Op is "read" (pull: the source is remote when the mode has a remote side) or "write" (push).
	Op string
	// Capacity is the size each region must have.
	Capacity uint64
	// Peer is "local" or "remote", for modes that can do both (auto).
	Peer string
	// Conns and ChunkBytes tune the tcp engine.
	Conns      int
	ChunkBytes int
	// Self is the path of this executable, for modes that start a peer process.
	Self string
	// HostThreads is how many goroutines the host backend copies one plan with (0: GOMAXPROCS).
	HostThreads int
}

// Target is a ready measurement: the engine, the two regions and the baseline to compare against.
type Target struct {
	Engine   engines.Engine
	Src, Dst engines.MemoryID
	// BaselineName names the baseline ("copy()", "plain-tcp"); Baseline moves n bytes at offset off of both
	// regions the plain way, for one thread. Nil when the mode has no baseline.
	BaselineName string
	Baseline     func(ctx context.Context, thread int, off, n uint64) error
	Close        func() error
}

var modeRegistry = struct {
	sync.Mutex
	byName map[string]Mode
}{byName: map[string]Mode{}}

// registerMode adds a mode; call it from init.
func registerMode(m Mode) {
	modeRegistry.Lock()
	defer modeRegistry.Unlock()
	if _, dup := modeRegistry.byName[m.Name]; dup {
		panic("xferbench: mode " + m.Name + " registered twice")
	}
	modeRegistry.byName[m.Name] = m
}

func lookupMode(name string) (Mode, error) {
	modeRegistry.Lock()
	defer modeRegistry.Unlock()
	m, ok := modeRegistry.byName[name]
	if !ok {
		var names []string
		for n := range modeRegistry.byName {
			names = append(names, n)
		}
		sort.Strings(names)
		return Mode{}, fmt.Errorf("unknown engine %q (have %v)", name, names)
	}
	return m, nil
}

func modeNames() []string {
	modeRegistry.Lock()
	defer modeRegistry.Unlock()
	var names []string
	for n := range modeRegistry.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func init() {
	registerMode(Mode{Name: "xgmi", Description: "same-node host copies through the xgmi engine's host backend; baseline copy()",
		Setup: setupHost})
	registerMode(Mode{Name: "auto", Description: "the composite engine (xgmi + tcp); -peer local or remote picks the pair",
		Setup: setupAuto})
}

// hostMemory maps size bytes outside the Go heap, as the agent's pool memory is.
func hostMemory(size uint64) ([]byte, func() error, error) {
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping %d bytes of host memory: %w", size, err)
	}
	// Touch every page so the first measured copy does not pay for page faults.
	for i := 0; i < len(b); i += 4096 {
		b[i] = byte(i)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

func hostDesc(id, node string, buf []byte) engines.MemoryDesc {
	return engines.MemoryDesc{ID: engines.MemoryID(id), Node: node, Location: engines.Location{Kind: engines.LocationHost},
		Size: uint64(len(buf)), Handles: engines.Handles{Host: buf}}
}

// localPair registers two host regions with e and returns them and a copy() baseline over the same memory.
func localPair(ctx context.Context, e engines.Engine, node string, capacity uint64) (*Target, error) {
	src, freeSrc, err := hostMemory(capacity)
	if err != nil {
		return nil, err
	}
	dst, freeDst, err := hostMemory(capacity)
	if err != nil {
		freeSrc()
		return nil, err
	}
	t := &Target{Engine: e, Src: engines.MemoryID(node + "/bench-src"), Dst: engines.MemoryID(node + "/bench-dst"),
		BaselineName: "copy()",
		Baseline: func(_ context.Context, _ int, off, n uint64) error {
			copy(dst[off:off+n], src[off:off+n])
			return nil
		}}
	for _, r := range []struct {
		id  engines.MemoryID
		buf []byte
	}{{t.Src, src}, {t.Dst, dst}} {
		if _, err := e.Register(ctx, hostDesc(string(r.id), node, r.buf)); err != nil {
			e.Close()
			freeSrc()
			freeDst()
			return nil, err
		}
	}
	t.Close = func() error {
		err := e.Close()
		freeSrc()
		freeDst()
		return err
	}
	return t, nil
}

func hostBackend(cfg SetupConfig) *xgmi.HostBackend {
	if cfg.HostThreads > 0 {
		return xgmi.NewHostBackendThreads(cfg.HostThreads)
	}
	return xgmi.NewHostBackend()
}

func setupHost(ctx context.Context, cfg SetupConfig) (*Target, error) {
	e, err := xgmi.New(xgmi.Options{Node: benchNode}, hostBackend(cfg))
	if err != nil {
		return nil, err
	}
	return localPair(ctx, e, benchNode, cfg.Capacity)
}

func setupAuto(ctx context.Context, cfg SetupConfig) (*Target, error) {
	// One region table for the node, as the agent keeps it: the composite plans once for its engines.
	regions := engines.NewRegistry(benchNode, 0)
	x, err := xgmi.New(xgmi.Options{Node: benchNode, Registry: regions}, hostBackend(cfg))
	if err != nil {
		return nil, err
	}
	if cfg.Peer != "remote" {
		comp, err := engines.NewComposite(engines.CompositeOptions{Node: benchNode, Registry: regions}, x)
		if err != nil {
			return nil, err
		}
		return localPair(ctx, comp, benchNode, cfg.Capacity)
	}
	return setupRemote(ctx, cfg, regions, func(t engines.Engine) (engines.Engine, error) {
		return engines.NewComposite(engines.CompositeOptions{Node: benchNode, Registry: regions}, x, t)
	})
}
