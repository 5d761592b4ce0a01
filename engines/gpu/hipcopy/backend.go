// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// Backend is the HIP backend of the xgmi engine: same-node copies where at
// least one side is AMD GPU memory, between GPUs with peer access (XGMI or
// PCIe P2P), inside one GPU, and between a GPU and host memory.
type Backend struct {
	rt   *hip.Runtime
	opts Options

	mu      sync.Mutex
	copiers map[int]*Copier // by HIP ordinal
	ords    gpushare.Ordinals
	regions map[engines.MemoryID]*mapped
	peers   map[[2]int]error // (from, to) ordinals → enabling peer access
	segPool sync.Pool        // *[]Segment
}

// mapped is how this process reaches one registered region.
type mapped struct {
	ordinal int    // HIP ordinal; -1 for host memory
	addr    uint64 // address of the region's first byte, in this process
	release func() error
}

// waitAfterCancel bounds how long Copy waits for queued GPU work after its
// context ended: the contract says Copy returns only once the hardware has
// stopped touching the memory.
const waitAfterCancel = 30 * time.Second

// NewBackend returns the HIP backend; copiers are created per GPU on first use.
func NewBackend(rt *hip.Runtime, opts Options) (*Backend, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	n, err := rt.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("counting HIP devices: %w", err)
	}
	b := newBackend(rt, opts)
	for i := 0; i < n; i++ {
		dev, err := rt.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		bus, err := rt.DevicePCIBusID(dev)
		if err != nil {
			return nil, err
		}
		b.ords.Add(bus, i)
	}
	return b, nil
}

func newBackend(rt *hip.Runtime, opts Options) *Backend {
	b := &Backend{rt: rt, opts: opts, copiers: map[int]*Copier{}, ords: gpushare.Ordinals{Runtime: "HIP"},
		regions: map[engines.MemoryID]*mapped{}, peers: map[[2]int]error{}}
	b.segPool.New = func() any { return new([]Segment) }
	return b
}

// Name implements xgmi.Backend.
func (b *Backend) Name() string { return "hip" }

// Limits implements xgmi.Backend: one launch takes at most 2^32-1 pieces.
func (b *Backend) Limits() engines.Limits { return engines.Limits{MaxPlanSegments: 1 << 24} }

// ordinal maps a location to a HIP ordinal.
func (b *Backend) ordinal(loc engines.Location) (int, error) { return b.ords.Of(loc) }

func (b *Backend) copier(ordinal int) (*Copier, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.copiers[ordinal]; ok {
		return c, nil
	}
	c, err := NewCopier(b.rt, ordinal, b.opts)
	if err != nil {
		return nil, err
	}
	b.copiers[ordinal] = c
	return c, nil
}

// Mode reports how scattered items move on GPU ordinal, and why not with the
// kernel when they do not.
func (b *Backend) Mode(ordinal int) (Mode, string, error) {
	c, err := b.copier(ordinal)
	if err != nil {
		return "", "", err
	}
	return c.Mode(), c.Reason(), nil
}

func isAMDGPU(d *engines.MemoryDesc) bool {
	return d.Location.Kind == engines.LocationGPU && d.Location.Vendor == engines.VendorAMD
}

// Claims implements xgmi.Backend.
func (b *Backend) Claims(src, dst *engines.MemoryDesc) (bool, string) {
	b.mu.Lock()
	ms, okS := b.regions[src.ID]
	md, okD := b.regions[dst.ID]
	b.mu.Unlock()
	s, d := gpushare.Side{Mapped: okS, Ordinal: -1}, gpushare.Side{Mapped: okD, Ordinal: -1}
	if okS {
		s.Ordinal = ms.ordinal
	}
	if okD {
		d.Ordinal = md.ordinal
	}
	return gpushare.Claim(engines.VendorAMD, src, dst, s, d, b.enablePeer)
}

// Copy implements xgmi.Backend: every segment of the plan in one submission
// on the source GPU's stream (the destination's when the source is host
// memory); pushing over XGMI keeps the reads local.
func (b *Backend) Copy(ctx context.Context, w engines.Work) error {
	b.mu.Lock()
	ms, okS := b.regions[w.Src.ID]
	md, okD := b.regions[w.Dst.ID]
	b.mu.Unlock()
	if !okS || !okD {
		return fmt.Errorf("%w: region not mapped by the hip backend", engines.ErrUnknownMemory)
	}
	ord := ms.ordinal
	if ord < 0 {
		ord = md.ordinal
	}
	c, err := b.copier(ord)
	if err != nil {
		return err
	}
	// The segment list is recycled: a plan of many small blocks would
	// otherwise allocate (and collect) hundreds of kilobytes per copy.
	buf := b.segPool.Get().(*[]Segment)
	defer b.segPool.Put(buf)
	segs := (*buf)[:0]
	for _, s := range w.Plan.Segments {
		segs = append(segs, Segment{Src: ms.addr + s.SrcOffset, Dst: md.addr + s.DstOffset, Size: s.Size})
	}
	*buf = segs
	route := RouteAuto
	if ms.ordinal < 0 || md.ordinal < 0 {
		route = RouteRuntime
	}
	start := time.Now()
	p, err := c.Submit(segs, route)
	if err != nil {
		return err
	}
	if b.opts.Observe != nil {
		defer func() {
			if p.Done() && p.err == nil {
				b.opts.Observe(CopyStats{Ordinal: ord, Segments: len(segs), Bytes: w.Plan.Bytes, Mode: c.Mode(),
					Device: p.DeviceTime(), Host: time.Since(start)})
			}
		}()
	}
	if err := p.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			wctx, cancel := context.WithTimeout(context.Background(), waitAfterCancel)
			defer cancel()
			if werr := p.Wait(wctx); werr != nil && wctx.Err() != nil {
				return fmt.Errorf("%w; the GPU copy did not finish within %v afterwards", ctx.Err(), waitAfterCancel)
			}
			return ctx.Err()
		}
		return err
	}
	return nil
}

// hostAddr is the address of a host region's first byte.
func hostAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// Close releases every mapping and copier.
func (b *Backend) Close() error {
	b.mu.Lock()
	regions, copiers := b.regions, b.copiers
	b.regions, b.copiers = map[engines.MemoryID]*mapped{}, map[int]*Copier{}
	b.mu.Unlock()
	var errs []error
	for id, m := range regions {
		if m.release != nil {
			if err := m.release(); err != nil {
				errs = append(errs, fmt.Errorf("releasing %s: %w", id, err))
			}
		}
	}
	for _, c := range copiers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
