// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi

import (
	"context"
	"runtime"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines"
)

const (
	// hostChunk is how much a host copy moves between checks of its context, each followed by a yield of the
	// processor (see yieldChunk).
	hostChunk = 4 << 20
	// parallelMinBytes is the least a goroutine is given when a plan is split: below it, starting goroutines
	// costs more than the copy.
	parallelMinBytes = 512 << 10
)

// HostBackend copies between two host regions of this node with the CPU. A plan of many scattered segments
// is bound by memory latency rather than bandwidth, so large plans are split over several goroutines, which
// keeps more cache misses in flight.
type HostBackend struct {
	threads int
}

// NewHostBackend returns the host-memory backend, copying each large plan on up to GOMAXPROCS goroutines.
func NewHostBackend() *HostBackend { return &HostBackend{threads: runtime.GOMAXPROCS(0)} }

// NewHostBackendThreads is NewHostBackend with an explicit number of goroutines per plan (at least 1).
func NewHostBackendThreads(threads int) *HostBackend { return &HostBackend{threads: max(1, threads)} }

// Name implements Backend.
func (*HostBackend) Name() string { return "host" }

// Claims implements Backend: both regions are host memory with a view in this process.
func (*HostBackend) Claims(src, dst *engines.MemoryDesc) (bool, string) {
	for _, d := range []*engines.MemoryDesc{src, dst} {
		if d.Location.Kind != engines.LocationHost {
			return false, string(d.ID) + " is " + d.Location.Kind.String() + " memory"
		}
		if d.Handles.Host == nil {
			return false, string(d.ID) + " has no host view in this process"
		}
	}
	return true, ""
}

// Register implements Backend; host memory needs no handle beyond its view.
func (*HostBackend) Register(_ context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	return d, nil
}

// Release implements Backend.
func (*HostBackend) Release(context.Context, *engines.MemoryDesc) error { return nil }

// Limits implements Backend: block plans are copied block by block, with no segment list.
func (*HostBackend) Limits() engines.Limits { return engines.Limits{BlockPlans: true} }

// Copy implements Backend. A context that has already ended moves nothing, however small the plan.
func (h *HostBackend) Copy(ctx context.Context, w engines.Work) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	src, dst := w.Src.Handles.Host, w.Dst.Handles.Host
	parts := min(h.threads, int(w.Plan.Bytes/parallelMinBytes))
	if l := w.Plan.Blocks; l != nil {
		return h.copyBlocks(ctx, dst, src, l, max(parts, 1))
	}
	if parts <= 1 {
		return copySegments(ctx, dst, src, w.Plan.Segments)
	}
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i, segs := range splitBytes(w.Plan.Segments, w.Plan.Bytes, parts) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = copySegments(ctx, dst, src, segs)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// copyBlocks copies a block list on parts goroutines, each a contiguous share of the ids.
func (h *HostBackend) copyBlocks(ctx context.Context, dst, src []byte, l *engines.BlockList, parts int) error {
	n := len(l.SrcIDs)
	if parts == 1 {
		return copyBlockRange(ctx, dst, src, l, 0, n)
	}
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = copyBlockRange(ctx, dst, src, l, i*n/parts, (i+1)*n/parts)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// copyBlockRange copies blocks [lo, hi) of l, checking the context every hostChunk bytes.
func copyBlockRange(ctx context.Context, dst, src []byte, l *engines.BlockList, lo, hi int) error {
	bs := l.BlockBytes
	per := max(int(hostChunk/bs), 1)
	for start := lo; start < hi; start += per {
		for i := start; i < min(start+per, hi); i++ {
			s, d := uint64(l.SrcIDs[i])*bs, uint64(l.DstIDs[i])*bs
			copy(dst[d:d+bs], src[s:s+bs])
		}
		if err := yieldChunk(ctx); err != nil {
			return err
		}
	}
	return nil
}

// yieldChunk is what a host copy does between chunks: it stops when its context ended, and otherwise lets other
// goroutines run. A large copy runs on as many goroutines as there are processors, and a memmove is not
// preempted, so without the yield the agent's own goroutines (a caller's cancel arriving, gRPC's readers, the
// hang-up watch) waited for the scheduler's 10 ms slices: a copy cancelled at 5 ms stopped 20 to 80 ms later.
func yieldChunk(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	runtime.Gosched()
	return nil
}

// copySegments copies in chunks so cancellation is prompt.
func copySegments(ctx context.Context, dst, src []byte, segs []engines.Segment) error {
	var sinceCheck uint64
	for _, s := range segs {
		for off := uint64(0); off < s.Size; {
			n := min(s.Size-off, hostChunk)
			copy(dst[s.DstOffset+off:s.DstOffset+off+n], src[s.SrcOffset+off:s.SrcOffset+off+n])
			off += n
			if sinceCheck += n + 64; sinceCheck >= hostChunk {
				sinceCheck = 0
				if err := yieldChunk(ctx); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// splitBytes cuts segments into parts of about total/parts bytes each, splitting segments where needed.
func splitBytes(segs []engines.Segment, total uint64, parts int) [][]engines.Segment {
	target := (total + uint64(parts) - 1) / uint64(parts)
	out := make([][]engines.Segment, 0, parts)
	var cur []engines.Segment
	var filled uint64
	for _, s := range segs {
		for s.Size > 0 {
			n := min(s.Size, target-filled)
			cur = append(cur, engines.Segment{SrcOffset: s.SrcOffset, DstOffset: s.DstOffset, Size: n})
			s.SrcOffset, s.DstOffset, s.Size = s.SrcOffset+n, s.DstOffset+n, s.Size-n
			if filled += n; filled == target {
				out = append(out, cur)
				cur, filled = nil, 0
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
