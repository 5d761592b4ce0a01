package xgmi

import (
	"context"

	"github.com/fabricxfer/fabricxfer/engines"
)

// hostChunk is how much a host copy moves between checks of its context.
const hostChunk = 16 << 20

// HostBackend copies between two host regions of this node with the CPU.
type HostBackend struct{}

// NewHostBackend returns the host-memory backend.
func NewHostBackend() *HostBackend { return &HostBackend{} }

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

// Limits implements Backend: none.
func (*HostBackend) Limits() engines.Limits { return engines.Limits{} }

// Copy implements Backend. Large segments are copied in chunks so cancellation is prompt.
func (*HostBackend) Copy(ctx context.Context, w engines.Work) error {
	src, dst := w.Src.Handles.Host, w.Dst.Handles.Host
	var sinceCheck uint64
	for _, s := range w.Plan.Segments {
		for off := uint64(0); off < s.Size; {
			n := min(s.Size-off, hostChunk)
			copy(dst[s.DstOffset+off:s.DstOffset+off+n], src[s.SrcOffset+off:s.SrcOffset+off+n])
			off += n
			if sinceCheck += n + 64; sinceCheck >= hostChunk {
				sinceCheck = 0
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
