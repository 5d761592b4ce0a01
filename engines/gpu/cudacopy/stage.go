// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"fmt"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
)

// Stager is the tcp engine's seam to this backend: it stages NVIDIA GPU regions the backend mapped (the
// same-node engine registers every region first) through pinned host memory, each call one submission on the
// region's GPU: scattered segments through device staging (SubmitBounced), a few large ones on the copy engine.
type Stager struct{ b *Backend }

var (
	_ tcp.Stager       = (*Stager)(nil)
	_ tcp.StagedBlocks = (*stagedRegion)(nil)
)

// Stager returns the backend's stager for the tcp engine.
func (b *Backend) Stager() *Stager { return &Stager{b: b} }

// stageDriverMax: a staged submission of at most this many segments goes to the copy engine, which moves a
// contiguous chunk across PCIe at full speed without occupying SMs; more go to the scatter kernel as one launch.
const stageDriverMax = 4

// Stage implements tcp.Stager. The mapping is held until the staged region is released, even when the
// same-node engine lets go of it first (deregistration releases the engines in parallel).
func (s *Stager) Stage(d engines.MemoryDesc) (tcp.StagedRegion, error) {
	m, c, err := s.b.reg.Hold(d.ID)
	if err != nil {
		return nil, err
	}
	return &stagedRegion{b: s.b, m: m, c: c, size: d.Size}, nil
}

// AllocPinned implements tcp.Stager: portable, device-mapped pinned memory, which kernels and copy engines of
// every GPU reach at its host address.
func (s *Stager) AllocPinned(n int) ([]byte, func() error, error) {
	if s.b.reg.Count() == 0 {
		return nil, nil, fmt.Errorf("no CUDA device")
	}
	var p uintptr
	err := s.b.withOrdinal(0, func() error {
		var err error
		p, err = s.b.drv.MemHostAlloc(uint64(n))
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	buf := unsafe.Slice((*byte)(cuda.HostPointer(p)), n)
	free := func() error { return s.b.withOrdinal(0, func() error { return s.b.drv.MemFreeHost(p) }) }
	return buf, free, nil
}

type stagedRegion struct {
	b    *Backend
	m    *mapped
	c    *Copier
	size uint64
}

func (r *stagedRegion) submit(buf []byte, segs []engines.Segment, toHost bool) (tcp.StageWait, error) {
	if len(buf) == 0 || len(segs) == 0 {
		return nil, fmt.Errorf("nothing to stage")
	}
	host := uint64(uintptr(unsafe.Pointer(&buf[0])))
	parts := make([]StagedPart, len(segs))
	var end uint64
	for i, sg := range segs {
		region, hostOff := sg.SrcOffset, sg.DstOffset
		if !toHost {
			region, hostOff = sg.DstOffset, sg.SrcOffset
		}
		// The engine checked the ranges against the region; a GPU overrun is silent, so check again.
		if sg.Size == 0 || region > r.size || sg.Size > r.size-region || hostOff > uint64(len(buf)) || sg.Size > uint64(len(buf))-hostOff {
			return nil, fmt.Errorf("%w: staging segment %+v outside the region (%d bytes) or buffer (%d bytes)", engines.ErrOutOfBounds, sg, r.size, len(buf))
		}
		parts[i] = StagedPart{Addr: r.m.Addr + region, Off: hostOff, Size: sg.Size}
		end = max(end, hostOff+sg.Size)
	}
	if len(parts) > stageDriverMax {
		return r.c.SubmitBounced(parts, host, end, toHost)
	}
	return r.c.SubmitRoute(stagedSegments(parts, host, toHost), RouteDriver)
}

// ToHost implements tcp.StagedRegion.
func (r *stagedRegion) ToHost(buf []byte, segs []engines.Segment) (tcp.StageWait, error) {
	return r.submit(buf, segs, true)
}

// FromHost implements tcp.StagedRegion.
func (r *stagedRegion) FromHost(buf []byte, segs []engines.Segment) (tcp.StageWait, error) {
	return r.submit(buf, segs, false)
}

// BlocksToHost implements tcp.StagedBlocks.
func (r *stagedRegion) BlocksToHost(buf []byte, bs uint64, ids []uint32) (tcp.StageWait, error) {
	return r.blocks(buf, bs, ids, true)
}

// BlocksFromHost implements tcp.StagedBlocks.
func (r *stagedRegion) BlocksFromHost(buf []byte, bs uint64, ids []uint32) (tcp.StageWait, error) {
	return r.blocks(buf, bs, ids, false)
}

// blocks queues one submission between blocks ids of the region and buf, packed in order.
func (r *stagedRegion) blocks(buf []byte, bs uint64, ids []uint32, toHost bool) (tcp.StageWait, error) {
	if len(buf) == 0 || len(ids) == 0 || bs == 0 {
		return nil, fmt.Errorf("nothing to stage")
	}
	// The engine checked the blocks against the region; a GPU overrun is silent, so check again.
	within := scatter.IDRange{Min: ids[0], Max: ids[0]}
	for _, id := range ids {
		within = scatter.IDRange{Min: min(within.Min, id), Max: max(within.Max, id)}
	}
	if uint64(within.Max) >= r.size/bs || bs > uint64(len(buf))/uint64(len(ids)) {
		return nil, fmt.Errorf("%w: %d staging blocks of %d bytes up to block %d outside the region (%d bytes) or buffer (%d bytes)",
			engines.ErrOutOfBounds, len(ids), bs, within.Max, r.size, len(buf))
	}
	host := uint64(uintptr(unsafe.Pointer(&buf[0])))
	return r.c.SubmitBouncedBlocks(r.m.Addr, bs, ids, within, host, toHost)
}

// Release implements tcp.StagedRegion: the mapping goes once neither engine holds it.
func (r *stagedRegion) Release() error {
	return r.b.reg.Unhold(r.m)
}
