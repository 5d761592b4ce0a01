// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"context"
	"time"

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
	reg  *gpushare.Registry[*Copier, hip.Device] // copiers by HIP ordinal, mapped regions, peer pairs
}

// mapped is how this process reaches one registered region.
type mapped = gpushare.Region

// runtime is what the registry asks of HIP: the current device is per thread, set around each call.
type runtime struct {
	*hip.Runtime
	opts Options
}

func (r runtime) NewCopier(ordinal int) (*Copier, error) {
	return NewCopier(r.Runtime, ordinal, r.opts)
}

func (r runtime) InOrdinal(ordinal int, fn func() error) error {
	dev, err := r.DeviceGet(ordinal)
	if err != nil {
		return err
	}
	return r.WithDevice(dev, fn)
}

// EnablePeer lets device fd address td's memory.
func (r runtime) EnablePeer(_, _ int, fd, td hip.Device) error {
	return r.WithDevice(fd, func() error { return r.EnablePeerAccess(td) })
}

// NewBackend returns the HIP backend; copiers are created per GPU on first use.
func NewBackend(rt *hip.Runtime, opts Options) (*Backend, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := newBackend(rt, opts)
	if err := b.reg.Enumerate(); err != nil {
		return nil, err
	}
	return b, nil
}

func newBackend(rt *hip.Runtime, opts Options) *Backend {
	return &Backend{rt: rt, opts: opts,
		reg: gpushare.NewRegistry[*Copier, hip.Device](runtime{rt, opts}, "hip", "HIP", engines.VendorAMD, "XGMI link")}
}

// Name implements xgmi.Backend.
func (b *Backend) Name() string { return "hip" }

// Limits implements xgmi.Backend: one launch takes at most 2^32-1 pieces.
func (b *Backend) Limits() engines.Limits { return engines.Limits{MaxPlanSegments: 1 << 24} }

// ordinal maps a location to a HIP ordinal.
func (b *Backend) ordinal(loc engines.Location) (int, error) { return b.reg.Of(loc) }

func (b *Backend) copier(ordinal int) (*Copier, error) { return b.reg.Copier(ordinal) }

// Mode reports how scattered items move on GPU ordinal, and why not with the
// kernel when they do not.
func (b *Backend) Mode(ordinal int) (Mode, string, error) {
	c, err := b.copier(ordinal)
	if err != nil {
		return "", "", err
	}
	return c.Mode(), c.Reason(), nil
}

// Modes is how scattered items move on each GPU whose copier is set up so far (at its first registration).
func (b *Backend) Modes() map[int]Mode {
	modes := map[int]Mode{}
	for ord, c := range b.reg.Copiers() {
		modes[ord] = c.Mode()
	}
	return modes
}

// Claims implements xgmi.Backend.
func (b *Backend) Claims(src, dst *engines.MemoryDesc) (bool, string) { return b.reg.Claims(src, dst) }

// Copy implements xgmi.Backend: every segment of the plan in one submission
// on the source GPU's stream (the destination's when the source is host
// memory); pushing over XGMI keeps the reads local.
func (b *Backend) Copy(ctx context.Context, w engines.Work) error {
	ms, md, ord, c, err := b.reg.CopierFor(w.Src.ID, w.Dst.ID)
	if err != nil {
		return err
	}
	buf := b.reg.Segments(w.Plan.Segments, ms.Addr, md.Addr)
	defer b.reg.PutSegments(buf)
	segs := *buf
	route := RouteAuto
	if ms.Ordinal < 0 || md.Ordinal < 0 {
		route = RouteRuntime // the kernel cannot address host memory, pinned or not
	}
	start := time.Now()
	p, err := c.Submit(segs, route)
	if err != nil {
		return err
	}
	if b.opts.Observe != nil {
		defer func() {
			if p.Done() && p.end.Err() == nil {
				b.opts.Observe(CopyStats{Ordinal: ord, Segments: len(segs), Bytes: w.Plan.Bytes, Mode: c.Mode(),
					Device: p.DeviceTime(), Host: time.Since(start)})
			}
		}()
	}
	return gpushare.WaitStopped(ctx, p)
}

// Close releases every mapping and copier.
func (b *Backend) Close() error { return b.reg.Close() }
