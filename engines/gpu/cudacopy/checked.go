// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// Block lists checked on the GPU: the ids go to the device as the caller sent them, and two kernels check them
// (range, repeated destinations) and move the blocks, so the host neither scans nor expands them. See
// fx_blocks_check and fx_blocks16 in native/kernels/copy.cu.

const (
	// maxCheckedBlocks bounds the destination blocks a checked list may address: the bitmap of the repeat
	// check is one bit per block (16 MiB of device memory at most).
	maxCheckedBlocks = 1 << 27
	// reportBytes is the head of a checked list's staging: the kernels' report, three u32 words.
	reportBytes = 16
	idNone      = math.MaxUint32
	// minCheckedIDs: shorter lists are checked on the host. The check kernel is a second launch (about
	// 6.5 µs of host time on the H200 VM), more than the host's passes over a thousand ids.
	minCheckedIDs = 1024
)

// errNotCheckable says a block list cannot take the checked kernels; the caller checks it on the host.
var errNotCheckable = errors.New("block list not checkable on the GPU")

// checkScratch is a Copier's device memory for checked lists, grown as lists grow; every checked launch runs on
// the Copier's one stream, in order, so one set serves them all.
type checkScratch struct {
	status cuda.DevicePtr // 3 u32: first bad entry, a repeated entry, finished blocks
	bitmap cuda.DevicePtr
	words  uint64
	ids    cuda.DevicePtr // 2 x idCap u32
	idCap  uint64
}

// CanCheckBlocks reports whether a list of blocks of bs bytes over region bases (16-byte aligned) and up to
// dstBlocks destination blocks can be checked and moved on the GPU (SubmitCheckedBlocks).
func (c *Copier) CanCheckBlocks(bs uint64, dstBlocks uint32) bool {
	return c.mode == ModeKernel && c.kernels != nil && c.kernels.blocksCheck != 0 &&
		bs%16 == 0 && bs > 0 && bs <= c.opts.MaxPiece && bs < c.opts.CopyEngineMin && dstBlocks <= maxCheckedBlocks
}

// checkable reports whether SubmitCheckedBlocks takes this list.
func (c *Copier) checkable(pairs []scatter.BlockBases, bs uint64, n int, dstBlocks uint32) bool {
	pieces := uint64(len(pairs)) * uint64(n)
	if !c.CanCheckBlocks(bs, dstBlocks) || n == 0 || len(pairs) == 0 || pieces > math.MaxUint32 || pieces*(bs/16) >= 1<<31 {
		return false
	}
	for _, p := range pairs {
		if p.Src%16 != 0 || p.Dst%16 != 0 {
			return false
		}
	}
	return true
}

// SubmitCheckedBlocks queues a block list whose ids nobody has checked: block srcIDs[i] of each pair's source to
// block dstIDs[i] of its destination, bs bytes each. Ids in the backend's pinned buffers (PinnedIDs) are read
// in place and must stay unchanged until the Pending ends; others are copied first. The GPU refuses the whole list, moving nothing, when an id
// is not below srcBlocks / dstBlocks or a destination id repeats; the Pending then ends with an error wrapping
// engines.ErrOutOfBounds or engines.ErrOverlap. errNotCheckable: the list does not fit the kernels.
func (c *Copier) SubmitCheckedBlocks(pairs []scatter.BlockBases, bs uint64, srcIDs, dstIDs []uint32, srcBlocks, dstBlocks uint32) (*Pending, error) {
	n := len(srcIDs)
	if n != len(dstIDs) {
		return nil, fmt.Errorf("%d source ids and %d destination ids", n, len(dstIDs))
	}
	if !c.checkable(pairs, bs, n, dstBlocks) {
		return nil, errNotCheckable
	}
	pieces := uint64(len(pairs)) * uint64(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &Pending{c: c, bytes: pieces * bs}
	p.end.Start()
	err := c.drv.WithContextKept(c.ctx, func() error {
		if err := c.growScratch(uint64(n), uint64(dstBlocks)); err != nil {
			return err
		}
		basesOff := uint64(reportBytes)
		idsOff := basesOff + 16*uint64(len(pairs))
		// Ids in the backend's pinned buffers are read there; others are copied into the staging first.
		pinnedSrc, inSrc := c.ids.at(srcIDs)
		pinnedDst, inDst := c.ids.at(dstIDs)
		inPlace := inSrc && inDst
		staged := idsOff
		if !inPlace {
			staged += 8 * uint64(n)
		}
		s, err := c.slots.Get(staged)
		if err != nil {
			return err
		}
		p.slot = s
		h := s.host()
		clear(h[:reportBytes])
		for i, pr := range pairs {
			binary.LittleEndian.PutUint64(h[basesOff+16*uint64(i):], pr.Src)
			binary.LittleEndian.PutUint64(h[basesOff+16*uint64(i)+8:], pr.Dst)
		}
		host := uint64(s.hostPtr)
		var hostSrc, hostDst uint64
		if inPlace {
			hostSrc, hostDst = uint64(pinnedSrc), uint64(pinnedDst)
			p.checked = &checkedList{srcIDs: u32Bytes(srcIDs), dstIDs: u32Bytes(dstIDs), srcBlocks: srcBlocks, dstBlocks: dstBlocks}
		} else {
			copy(h[idsOff:], u32Bytes(srcIDs))
			copy(h[idsOff+4*uint64(n):], u32Bytes(dstIDs))
			p.checked = &checkedList{srcIDs: h[idsOff:][:4*n], dstIDs: h[idsOff+4*uint64(n):][:4*n],
				srcBlocks: srcBlocks, dstBlocks: dstBlocks}
			hostSrc, hostDst = host+idsOff, host+idsOff+4*uint64(n)
		}
		devSrc, devDst := uint64(c.check.ids), uint64(c.check.ids)+4*c.check.idCap
		status, bitmap := uint64(c.check.status), uint64(c.check.bitmap)
		count, npairs := uint32(n), uint32(len(pairs))
		grid := uint32(min((n+threadsPerBlock-1)/threadsPerBlock, c.sms*blocksPerSM))
		cfg := cuda.LaunchConfig{GridX: grid, BlockX: threadsPerBlock, Stream: c.stream}
		if err := c.drv.Launch(c.kernels.blocksCheck, cfg, []unsafe.Pointer{
			unsafe.Pointer(&hostSrc), unsafe.Pointer(&hostDst), unsafe.Pointer(&count),
			unsafe.Pointer(&srcBlocks), unsafe.Pointer(&dstBlocks), unsafe.Pointer(&devSrc), unsafe.Pointer(&devDst),
			unsafe.Pointer(&bitmap), unsafe.Pointer(&status)}); err != nil {
			return err
		}
		per := uint32(bs / 16)
		chunk := uint64(scatter.FlatChunk(per, threadsPerBlock))
		runs := (pieces + chunk - 1) / chunk
		cfg.GridX = uint32(min(runs, uint64(c.sms*blocksPerSM)))
		bases, report := host+basesOff, host
		// The copy's last block writes the done word behind the report (its own block counter is status[2]).
		sig := c.kernelSignal()
		if err := c.drv.Launch(c.kernels.blocks16, cfg, []unsafe.Pointer{
			unsafe.Pointer(&bases), unsafe.Pointer(&npairs), unsafe.Pointer(&count),
			unsafe.Pointer(&devSrc), unsafe.Pointer(&devDst), unsafe.Pointer(&dstBlocks), unsafe.Pointer(&per),
			unsafe.Pointer(&bitmap), unsafe.Pointer(&status), unsafe.Pointer(&report), unsafe.Pointer(&sig)}); err != nil {
			return err
		}
		return c.queueEndAfter(p, sig)
	})
	if err != nil {
		_ = c.drv.WithContext(c.ctx, func() error { return c.drv.StreamSynchronize(c.stream) })
		c.release(p)
		return nil, fmt.Errorf("queueing %d checked blocks of %d region pairs on GPU %d: %w", n, len(pairs), c.dev, err)
	}
	return p, nil
}

// growScratch makes the device scratch hold n ids a side and a bitmap of dstBlocks bits; c.mu is held and the
// context current. New memory is set up as the kernels expect it (status "none", bitmap clear).
func (c *Copier) growScratch(n, dstBlocks uint64) error {
	sc := &c.check
	if sc.status == 0 {
		p, err := c.drv.MemAlloc(16)
		if err != nil {
			return err
		}
		if err := c.drv.MemsetD8(p, 0xff, 8); err != nil {
			return errors.Join(err, c.drv.MemFree(p))
		}
		if err := c.drv.MemsetD8(p+8, 0, 8); err != nil {
			return errors.Join(err, c.drv.MemFree(p))
		}
		sc.status = p
	}
	if words := (dstBlocks + 31) / 32; words > sc.words {
		words = max(words, 1<<13) // 256 Ki blocks at least: one pool of KV blocks
		// Earlier launches may still read the old bitmap.
		if err := c.drv.StreamSynchronize(c.stream); err != nil {
			return err
		}
		p, err := c.drv.MemAlloc(4 * words)
		if err != nil {
			return err
		}
		if err := c.drv.MemsetD8(p, 0, 4*words); err != nil {
			return errors.Join(err, c.drv.MemFree(p))
		}
		if sc.bitmap != 0 {
			_ = c.drv.MemFree(sc.bitmap)
		}
		sc.bitmap, sc.words = p, words
	}
	if n > sc.idCap {
		capacity := max(n, 1<<14)
		if err := c.drv.StreamSynchronize(c.stream); err != nil {
			return err
		}
		p, err := c.drv.MemAlloc(8 * capacity)
		if err != nil {
			return err
		}
		if sc.ids != 0 {
			_ = c.drv.MemFree(sc.ids)
		}
		sc.ids, sc.idCap = p, capacity
	}
	return nil
}

// freeScratch releases the checked lists' device memory; the stream is idle and the context current.
func (c *Copier) freeScratch() error {
	var errs []error
	for _, p := range []cuda.DevicePtr{c.check.status, c.check.bitmap, c.check.ids} {
		if p != 0 {
			errs = append(errs, c.drv.MemFree(p))
		}
	}
	c.check = checkScratch{}
	return errors.Join(errs...)
}

// checkedList is what a Pending of SubmitCheckedBlocks needs to read the kernels' verdict: the staged ids
// (the report names entries) and the bounds they were checked against.
type checkedList struct {
	srcIDs, dstIDs       []byte
	srcBlocks, dstBlocks uint32
}

// verdict reads the report the kernels left in the staging's first words, once the launch has completed.
func (l *checkedList) verdict(report []byte) error {
	if binary.LittleEndian.Uint32(report[8:]) != 1 {
		return errors.New("the checked block copy completed without reporting")
	}
	if i := binary.LittleEndian.Uint32(report[0:]); i != idNone {
		s, d := binary.LittleEndian.Uint32(l.srcIDs[4*i:]), binary.LittleEndian.Uint32(l.dstIDs[4*i:])
		if s >= l.srcBlocks {
			return fmt.Errorf("%w: source block %d (entry %d) is outside the source's %d blocks; nothing was moved", engines.ErrOutOfBounds, int32(s), i, l.srcBlocks)
		}
		return fmt.Errorf("%w: destination block %d (entry %d) is outside the destination's %d blocks; nothing was moved", engines.ErrOutOfBounds, int32(d), i, l.dstBlocks)
	}
	if i := binary.LittleEndian.Uint32(report[4:]); i != idNone {
		return fmt.Errorf("%w: destination block %d is named twice (entry %d); nothing was moved", engines.ErrOverlap, binary.LittleEndian.Uint32(l.dstIDs[4*i:]), i)
	}
	return nil
}

// u32Bytes views ids as bytes in the machine's order (little-endian, as the kernels read them).
func u32Bytes(ids []uint32) []byte {
	if len(ids) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids))
}
