// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"fmt"
	"math"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// StagedPart is one piece of a staged chunk: Size bytes at Addr (device memory or memory the kernel reaches) and
// at Off in the chunk's packed host buffer.
type StagedPart struct {
	Addr, Off, Size uint64
}

// SubmitBounced queues the copies of one staged chunk of n bytes between its parts and the pinned host buffer
// at host, through device memory: toHost, the kernel gathers the parts into the bounce buffer and the copy
// engine moves it to host; else the copy engine moves host into the bounce buffer and the kernel scatters it.
// The kernel then reads and writes device memory only, instead of reaching across PCIe a part at a time
// (720 B blocks read from host memory that way took a kernel 100-300 µs per 737 KB chunk on the H200), and the
// PCIe crossing is one copy-engine transfer, which runs beside other contexts' kernels. Copiers without the
// kernels take the parts as driver copies straight between host and device.
func (c *Copier) SubmitBounced(parts []StagedPart, host, n uint64, toHost bool) (*Pending, error) {
	if len(parts) == 0 || n == 0 {
		return nil, errors.New("nothing to stage")
	}
	if c.mode != ModeKernel {
		return c.SubmitRoute(stagedSegments(parts, host, toHost), RouteDriver)
	}
	return c.bounced(n, len(parts), host, toHost, func(bounce uint64) stageFunc {
		if stage := c.bouncedBlocks(parts, bounce, toHost); stage != nil {
			return stage
		}
		return c.segmentStage(parts, bounce, toHost)
	})
}

// SubmitBouncedBlocks is SubmitBounced for a chunk of whole blocks given by index: block ids[k] of the blocks
// of bs bytes from base, packed as block k of the host buffer at host. The kernel's descriptors are written
// from the ids (one multiply-add each), with no part per block to build and read back; within is the range of
// the ids. A list the block form cannot describe goes through SubmitBounced.
func (c *Copier) SubmitBouncedBlocks(base, bs uint64, ids []uint32, within scatter.IDRange, host uint64, toHost bool) (*Pending, error) {
	if len(ids) == 0 || bs == 0 {
		return nil, errors.New("nothing to stage")
	}
	n := bs * uint64(len(ids))
	if c.mode != ModeKernel || bs >= c.opts.CopyEngineMin {
		return c.SubmitBounced(blockParts(base, bs, ids), host, n, toHost)
	}
	return c.bounced(n, len(ids), host, toHost, func(bounce uint64) stageFunc {
		packed := c.iotaLocked(len(ids))
		all := scatter.IDRange{Min: 0, Max: uint32(len(ids) - 1)}
		if stage := c.bouncedIDs(base, bs, ids, within, packed, all, bounce, toHost); stage != nil {
			return stage
		}
		return c.segmentStage(blockParts(base, bs, ids), bounce, toHost)
	})
}

// stageFunc writes a submission's kernel descriptors (see submitLocked).
type stageFunc = func() (scatter.Layout, *slot, uint64, error)

// segmentStage is the descriptor staging of parts as one segment each, between their places and the device
// staging at bounce: what the block form cannot describe.
func (c *Copier) segmentStage(parts []StagedPart, bounce uint64, toHost bool) stageFunc {
	kernelSegs := stagedSegments(parts, bounce, toHost)
	return func() (scatter.Layout, *slot, uint64, error) { return c.stageDescriptors(kernelSegs) }
}

// bounced queues one staged chunk of n bytes in parts pieces through the device staging: stage(bounce) says how
// the kernel moves the pieces between their places and the staging, the copy engine moves the staging to or from
// host.
func (c *Copier) bounced(n uint64, parts int, host uint64, toHost bool, stage func(bounce uint64) stageFunc) (*Pending, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var bounce uint64
	err := c.drv.WithContextKept(c.ctx, func() error {
		b, err := c.bounceLocked(n)
		bounce = uint64(b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of device staging on GPU %d: %w", n, c.dev, err)
	}
	crossing := []Segment{{Src: bounce, Dst: host, Size: n}}
	var before, after []Segment
	if toHost {
		after = crossing
	} else {
		crossing[0] = Segment{Src: host, Dst: bounce, Size: n}
		before = crossing
	}
	p, err := c.submitLocked(n, kernelWork{stage: stage(bounce)}, nil, before, after, RouteAuto, false)
	if err != nil {
		return nil, fmt.Errorf("queueing a staged chunk of %d parts on GPU %d: %w", parts, c.dev, err)
	}
	return p, nil
}

// blockParts are the parts of whole blocks given by index, packed in order.
func blockParts(base, bs uint64, ids []uint32) []StagedPart {
	parts := make([]StagedPart, len(ids))
	for k, id := range ids {
		parts[k] = StagedPart{Addr: base + uint64(id)*bs, Off: uint64(k) * bs, Size: bs}
	}
	return parts
}

// iotaLocked returns 0, 1, ..., n-1: the packed positions of a chunk's blocks. c.mu is held.
func (c *Copier) iotaLocked(n int) []uint32 {
	for k := len(c.iota); k < n; k++ {
		c.iota = append(c.iota, uint32(k))
	}
	return c.iota[:n]
}

// stagedSegments are the copies between parts and a packed buffer at base: from the parts into it (toHost), or
// out of it into them.
func stagedSegments(parts []StagedPart, base uint64, toHost bool) []Segment {
	segs := make([]Segment, len(parts))
	for i, p := range parts {
		segs[i] = Segment{Src: p.Addr, Dst: base + p.Off, Size: p.Size}
		if !toHost {
			segs[i] = Segment{Src: base + p.Off, Dst: p.Addr, Size: p.Size}
		}
	}
	return segs
}

// bouncedBlocks returns the descriptor staging of a chunk of equal blocks (a block list's chunk) in block form,
// one 8-byte descriptor written per block from its ids (a fraction of the host time of a segment each); nil when
// the parts are not such blocks. Ids count blocks from the lowest part's address and from the buffer's start.
func (c *Copier) bouncedBlocks(parts []StagedPart, bounce uint64, toHost bool) stageFunc {
	bs, base := parts[0].Size, parts[0].Addr
	if bs >= c.opts.CopyEngineMin {
		return nil
	}
	for _, p := range parts {
		if p.Size != bs {
			return nil
		}
		base = min(base, p.Addr)
	}
	at, off := make([]uint32, len(parts)), make([]uint32, len(parts))
	atRange, offRange := scatter.IDRange{Min: math.MaxUint32}, scatter.IDRange{Min: math.MaxUint32}
	for i, p := range parts {
		d := p.Addr - base
		if d%bs != 0 || p.Off%bs != 0 || d/bs > math.MaxUint32 || p.Off/bs > math.MaxUint32 {
			return nil
		}
		at[i], off[i] = uint32(d/bs), uint32(p.Off/bs)
		atRange = scatter.IDRange{Min: min(atRange.Min, at[i]), Max: max(atRange.Max, at[i])}
		offRange = scatter.IDRange{Min: min(offRange.Min, off[i]), Max: max(offRange.Max, off[i])}
	}
	return c.bouncedIDs(base, bs, at, atRange, off, offRange, bounce, toHost)
}

// bouncedIDs returns the descriptor staging of blocks at (within atRange) of the blocks of bs bytes from base,
// each to or from block packed[k] (within offRange) of the device staging at bounce; nil when the block form
// cannot describe them.
func (c *Copier) bouncedIDs(base, bs uint64, at []uint32, atRange scatter.IDRange, packed []uint32, offRange scatter.IDRange, bounce uint64, toHost bool) stageFunc {
	pairs := []scatter.BlockBases{{Src: base, Dst: bounce}}
	srcIDs, dstIDs, src, dst := at, packed, atRange, offRange
	if !toHost {
		pairs[0] = scatter.BlockBases{Src: bounce, Dst: base}
		srcIDs, dstIDs, src, dst = packed, at, offRange, atRange
	}
	l, ok := scatter.PlanBlocks(pairs, bs, len(at), src, dst, c.opts.MaxPiece)
	if !ok {
		return nil
	}
	return c.blockStage(l, pairs, bs, srcIDs, dstIDs)
}

// bounceLocked returns device staging of at least n bytes. Growing it waits for the stream first: queued
// submissions may still use the old buffer. c.mu is held and the context current.
func (c *Copier) bounceLocked(n uint64) (cuda.DevicePtr, error) {
	if n <= c.bounceSize {
		return c.bounce, nil
	}
	if c.bounce != 0 {
		if err := c.drv.StreamSynchronize(c.stream); err != nil {
			return 0, err
		}
		if err := c.drv.MemFree(c.bounce); err != nil {
			return 0, err
		}
		c.bounce, c.bounceSize = 0, 0
	}
	size := uint64(1 << 20)
	for size < n {
		size *= 2
	}
	p, err := c.drv.MemAlloc(size)
	if err != nil {
		return 0, err
	}
	c.bounce, c.bounceSize = p, size
	return p, nil
}

// freeBounce frees the device staging; the stream is idle and the context current.
func (c *Copier) freeBounce() error {
	if c.bounce == 0 {
		return nil
	}
	err := c.drv.MemFree(c.bounce)
	c.bounce, c.bounceSize = 0, 0
	return err
}
