// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// Runtime is what a backend's GPU runtime does its own way, as the Registry needs it: device handles and peer
// reachability (the bindings' own calls), setting up a GPU's copier, making a GPU current around a call (CUDA:
// its primary context; HIP: the thread's device) and enabling peer access. Each backend implements it on a
// small unexported type; none of it is on the copy path (Copier.Submit, Pending.Wait), which stays concrete.
type Runtime[C Closer, D any] interface {
	DeviceCount() (int, error)
	DeviceGet(ordinal int) (D, error)
	DevicePCIBusID(dev D) (string, error)
	CanAccessPeer(dev, peer D) (bool, error)
	// NewCopier sets up GPU ordinal's copier (context or device, stream, kernels); the Registry's lock is
	// held, so it must not call back into the Registry.
	NewCopier(ordinal int) (C, error)
	// InOrdinal runs fn with GPU ordinal current, restoring the caller's state afterwards.
	InOrdinal(ordinal int, fn func() error) error
	// EnablePeer lets GPU from (device fd) address GPU to's memory (device td); the runtime said it can.
	EnablePeer(from, to int, fd, td D) error
}

// Closer is a backend's per-GPU copier as the Registry sees it.
type Closer interface{ Close() error }

// Region is how this process reaches one registered region.
type Region struct {
	Ordinal int    // the runtime's GPU ordinal; -1 for host memory
	Addr    uint64 // address of the region's first byte, in this process
	Release func() error
	// Pinned host memory is page-locked by the runtime (on CUDA that also makes it addressable by kernels);
	// pageable host memory only moves through the runtime's copies.
	Pinned bool
	// refs counts staged handles on the mapping (Hold, guarded by the Registry's lock); when the region is
	// released while some remain, dropped is set and the last Unhold releases it.
	refs    int
	dropped bool
}

// Registry is what a GPU backend of the xgmi engine keeps, the same on every runtime: one copier per GPU
// (made on first use), the regions it mapped, and the outcome of enabling peer access for each pair of GPUs.
// One lock guards the three. Safe for concurrent use.
type Registry[C Closer, D any] struct {
	// Ordinals maps the agent's GPU locations to the runtime's ordinals; filled before use.
	Ordinals
	rt     Runtime[C, D]
	name   string // the backend's name in errors: "cuda", "hip"
	vendor engines.Vendor
	link   string // the direct link a refusal names: "NVLink", "XGMI link"

	mu      sync.Mutex
	copiers map[int]C
	regions map[engines.MemoryID]*Region
	peers   map[[2]int]error // (from, to) ordinals → enabling peer access
	segs    sync.Pool        // *[]scatter.Segment
	// released counts the regions released (Release): what a copier keeps by address (a replayed copy) is
	// stale once it moves, since a later region may take the same addresses.
	released atomic.Uint64
}

// MappingEpoch is the number of regions released so far; it moves before any of their memory is unmapped.
func (r *Registry[C, D]) MappingEpoch() uint64 { return r.released.Load() }

// NewRegistry returns an empty registry of the backend name ("cuda") over runtime (named in errors, "CUDA")
// for vendor's GPUs, whose direct GPU links are called link.
func NewRegistry[C Closer, D any](rt Runtime[C, D], name, runtime string, vendor engines.Vendor, link string) *Registry[C, D] {
	r := &Registry[C, D]{Ordinals: Ordinals{Runtime: runtime}, rt: rt, name: name, vendor: vendor, link: link,
		copiers: map[int]C{}, regions: map[engines.MemoryID]*Region{}, peers: map[[2]int]error{}}
	r.segs.New = func() any { return new([]scatter.Segment) }
	return r
}

// Enumerate records every device the runtime shows under its PCI address.
func (r *Registry[C, D]) Enumerate() error {
	n, err := r.rt.DeviceCount()
	if err != nil {
		return fmt.Errorf("counting %s devices: %w", r.Runtime, err)
	}
	for i := 0; i < n; i++ {
		dev, err := r.rt.DeviceGet(i)
		if err != nil {
			return err
		}
		bus, err := r.rt.DevicePCIBusID(dev)
		if err != nil {
			return err
		}
		r.Add(bus, i)
	}
	return nil
}

// Owns reports whether d is GPU memory of the backend's vendor.
func (r *Registry[C, D]) Owns(d *engines.MemoryDesc) bool {
	return d.Location.Kind == engines.LocationGPU && d.Location.Vendor == r.vendor
}

// Copier is GPU ordinal's copier, set up on first use.
func (r *Registry[C, D]) Copier(ordinal int) (C, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.copiers[ordinal]; ok {
		return c, nil
	}
	c, err := r.rt.NewCopier(ordinal)
	if err != nil {
		return c, err
	}
	r.copiers[ordinal] = c
	return c, nil
}

// Copiers are the copiers set up so far, by ordinal.
func (r *Registry[C, D]) Copiers() map[int]C {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.copiers)
}

// AnyCopier is one copier already set up, if any.
func (r *Registry[C, D]) AnyCopier() (C, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.copiers {
		return c, true
	}
	var none C
	return none, false
}

// Put records how this process reaches region id.
func (r *Registry[C, D]) Put(id engines.MemoryID, m *Region) {
	r.mu.Lock()
	r.regions[id] = m
	r.mu.Unlock()
}

// Pair returns the mappings of a pair of regions; ok is false when the backend mapped either not.
func (r *Registry[C, D]) Pair(src, dst engines.MemoryID) (ms, md *Region, ok bool) {
	r.mu.Lock()
	ms, okS := r.regions[src]
	md, okD := r.regions[dst]
	r.mu.Unlock()
	return ms, md, okS && okD
}

// CopierFor looks up a pair of regions and the copier of the GPU that runs copies between them: the
// source's, the destination's when the source is host memory (pushing over a GPU link keeps the reads local).
func (r *Registry[C, D]) CopierFor(src, dst engines.MemoryID) (ms, md *Region, ord int, c C, err error) {
	ms, md, ok := r.Pair(src, dst)
	if !ok {
		return nil, nil, 0, c, r.NotMapped()
	}
	ord = ms.Ordinal
	if ord < 0 {
		ord = md.Ordinal
	}
	c, err = r.Copier(ord)
	return ms, md, ord, c, err
}

// NotMapped is the error of a copy between regions Pair does not know.
func (r *Registry[C, D]) NotMapped() error {
	return fmt.Errorf("%w: region not mapped by the %s backend", engines.ErrUnknownMemory, r.name)
}

// Lock and Unlock guard RegionLocked, for callers that look up many regions at once.
func (r *Registry[C, D]) Lock()   { r.mu.Lock() }
func (r *Registry[C, D]) Unlock() { r.mu.Unlock() }

// RegionLocked is region id's mapping; the caller holds Lock.
func (r *Registry[C, D]) RegionLocked(id engines.MemoryID) (*Region, bool) {
	m, ok := r.regions[id]
	return m, ok
}

// Claims is the pair rule (Claim) over the regions this backend mapped.
func (r *Registry[C, D]) Claims(src, dst *engines.MemoryDesc) (bool, string) {
	r.mu.Lock()
	ms, okS := r.regions[src.ID]
	md, okD := r.regions[dst.ID]
	r.mu.Unlock()
	s, d := Side{Mapped: okS, Ordinal: -1}, Side{Mapped: okD, Ordinal: -1}
	if okS {
		s.Ordinal = ms.Ordinal
	}
	if okD {
		d.Ordinal = md.Ordinal
	}
	return Claim(r.vendor, src, dst, s, d, r.EnablePeer)
}

// EnablePeer lets GPU from address GPU to's memory, asking the runtime once per pair and remembering the
// outcome, a refusal included.
func (r *Registry[C, D]) EnablePeer(from, to int) error {
	r.mu.Lock()
	err, done := r.peers[[2]int{from, to}]
	r.mu.Unlock()
	if done {
		return err
	}
	err = func() error {
		fd, err := r.rt.DeviceGet(from)
		if err != nil {
			return err
		}
		td, err := r.rt.DeviceGet(to)
		if err != nil {
			return err
		}
		ok, err := r.rt.CanAccessPeer(fd, td)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("no peer access between them (no " + r.link + " or PCIe P2P)")
		}
		return r.rt.EnablePeer(from, to, fd, td)
	}()
	r.mu.Lock()
	r.peers[[2]int{from, to}] = err
	r.mu.Unlock()
	return err
}

// SetPeer records the outcome of enabling peer access from GPU from to GPU to, as EnablePeer would.
func (r *Registry[C, D]) SetPeer(from, to int, err error) {
	r.mu.Lock()
	r.peers[[2]int{from, to}] = err
	r.mu.Unlock()
}

// Accessors are the GPUs to grant access to memory of GPU owner: itself and every GPU with peer access to it.
func (r *Registry[C, D]) Accessors(owner int) []D {
	od, _ := r.rt.DeviceGet(owner)
	devs := []D{od}
	for i := range r.Count() {
		if i == owner {
			continue
		}
		d, err := r.rt.DeviceGet(i)
		if err != nil {
			continue
		}
		if ok, err := r.rt.CanAccessPeer(d, od); err == nil && ok {
			devs = append(devs, d)
		}
	}
	return devs
}

// InOrdinal runs fn with GPU ordinal current, restoring the caller's state.
func (r *Registry[C, D]) InOrdinal(ordinal int, fn func() error) error {
	return r.rt.InOrdinal(ordinal, fn)
}

// MapGPU maps GPU memory d into this process on GPU m.Ordinal by the first handle it has, with that GPU
// current: its pointer (memory of this process), a VMM fd or a legacy IPC handle.
func (r *Registry[C, D]) MapGPU(m *Region, d *engines.MemoryDesc, adopt, importVMM, openIPC func() error) error {
	err := r.rt.InOrdinal(m.Ordinal, func() error {
		switch {
		case d.Handles.Ptr != 0:
			return adopt()
		case d.Handles.VMM != nil:
			return importVMM()
		case len(d.Handles.IPC) == engines.IPCHandleSize:
			return openIPC()
		}
		return fmt.Errorf("GPU memory %s has no pointer, VMM fd or IPC handle", d.ID)
	})
	if err != nil {
		return fmt.Errorf("mapping %s on GPU %d: %w", d.ID, m.Ordinal, err)
	}
	return nil
}

// ReleaseIn makes m's release run fn with its GPU current.
func (r *Registry[C, D]) ReleaseIn(m *Region, fn func() error) {
	m.Release = func() error { return r.rt.InOrdinal(m.Ordinal, fn) }
}

// PutHost records host memory d (which has a host view), page-locked by pin (with GPU 0 current) when the
// runtime allows: memory it will not pin (already pinned elsewhere, limits) still moves, staged by the
// runtime's copies. unpin undoes pin at release.
func (r *Registry[C, D]) PutHost(d *engines.MemoryDesc, pin func(addr uintptr, size uint64) error, unpin func(addr uintptr) error) {
	m := &Region{Ordinal: -1, Addr: HostAddr(d.Handles.Host)}
	if r.Count() > 0 && r.rt.InOrdinal(0, func() error { return pin(uintptr(m.Addr), d.Size) }) == nil {
		m.Pinned = true
		m.Release = func() error { return r.rt.InOrdinal(0, func() error { return unpin(uintptr(m.Addr)) }) }
	}
	r.Put(d.ID, m)
}

// HostAddr is the address of a host region's first byte.
func HostAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// ExportedFD wraps a VMM fd the runtime exported for region id: it travels with the descriptor and is closed
// with the region.
func ExportedFD(fd int, id engines.MemoryID) *os.File {
	return os.NewFile(uintptr(fd), "vmm:"+string(id))
}

// IPC is the legacy IPC mapping of a runtime: H its 64-byte handle, P its device pointer.
type IPC[H ~[64]byte, P ~uint64] interface {
	IPCOpenMemHandle(h H) (P, error)
	IPCCloseMemHandle(p P) error
	// IPCAllocationSize is the size of the allocation a pointer IPCOpenMemHandle returned starts.
	IPCAllocationSize(p P) (uint64, error)
}

// OpenIPC maps the allocation d's legacy IPC handle names (the current GPU's must be current) and points m at
// d's offset in it; m's release closes the mapping with m's GPU current. A region that runs past the allocation
// is refused (engines.ErrInvalid): the handle names the whole allocation and the caller says where its bytes
// are, so without the check a caller's copies would reach whatever the agent maps beyond it, another caller's
// memory included.
func OpenIPC[H ~[64]byte, P ~uint64, C Closer, D any](r *Registry[C, D], ipc IPC[H, P], m *Region, d *engines.MemoryDesc) error {
	var h H
	copy(h[:], d.Handles.IPC)
	ptr, err := ipc.IPCOpenMemHandle(h)
	if err != nil {
		return err
	}
	size, err := ipc.IPCAllocationSize(ptr)
	if err == nil && (d.Handles.IPCOffset > size || d.Size > size-d.Handles.IPCOffset) {
		err = fmt.Errorf("%w: the region (offset %d, %d bytes) runs past the %d-byte allocation its IPC handle names", engines.ErrInvalid, d.Handles.IPCOffset, d.Size, size)
	} else if err != nil {
		err = fmt.Errorf("finding the size of the allocation an IPC handle names: %w", err)
	}
	if err != nil {
		if cerr := ipc.IPCCloseMemHandle(ptr); cerr != nil {
			return errors.Join(err, fmt.Errorf("closing the IPC mapping: %w", cerr))
		}
		return err
	}
	m.Addr = uint64(ptr) + d.Handles.IPCOffset
	r.ReleaseIn(m, func() error { return ipc.IPCCloseMemHandle(ptr) })
	return nil
}

// Release forgets region id and releases its mapping, unless staged handles still hold it (Hold): then the
// last of them releases it.
func (r *Registry[C, D]) Release(id engines.MemoryID) error {
	r.mu.Lock()
	m, ok := r.regions[id]
	delete(r.regions, id)
	if ok {
		r.released.Add(1)
	}
	held := ok && m.refs > 0
	if held {
		m.dropped = true
	}
	r.mu.Unlock()
	if !ok || held || m.Release == nil {
		return nil
	}
	if err := m.Release(); err != nil {
		return fmt.Errorf("releasing %s: %w", id, err)
	}
	return nil
}

// Hold takes a handle on GPU region id and returns it with its GPU's copier; the mapping stays until the
// handle is given back (Unhold), even when the region is released first.
func (r *Registry[C, D]) Hold(id engines.MemoryID) (*Region, C, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var none C
	m, ok := r.regions[id]
	switch {
	case !ok:
		return nil, none, fmt.Errorf("%s is not %s GPU memory the %s backend mapped", id, strings.ToUpper(string(r.vendor)), r.Runtime)
	case m.Ordinal < 0:
		return nil, none, fmt.Errorf("%s is host memory, not GPU memory", id)
	}
	c, ok := r.copiers[m.Ordinal]
	if !ok {
		return nil, none, fmt.Errorf("%s: no copier on GPU %d", id, m.Ordinal)
	}
	m.refs++
	return m, c, nil
}

// Unhold gives back a handle from Hold; the last one of a released region releases its mapping.
func (r *Registry[C, D]) Unhold(m *Region) error {
	r.mu.Lock()
	m.refs--
	var rel func() error
	if m.refs == 0 && m.dropped {
		rel = m.Release
	}
	r.mu.Unlock()
	if rel != nil {
		return rel()
	}
	return nil
}

// Segments is a plan's segments at the addresses of its source and destination, in a list recycled through
// PutSegments: a plan of many small blocks would otherwise allocate (and collect) hundreds of kilobytes per
// copy.
func (r *Registry[C, D]) Segments(segs []engines.Segment, src, dst uint64) *[]scatter.Segment {
	buf := r.segs.Get().(*[]scatter.Segment)
	out := (*buf)[:0]
	for _, s := range segs {
		out = append(out, scatter.Segment{Src: src + s.SrcOffset, Dst: dst + s.DstOffset, Size: s.Size})
	}
	*buf = out
	return buf
}

// PutSegments hands back a list from Segments once its submission is queued.
func (r *Registry[C, D]) PutSegments(buf *[]scatter.Segment) { r.segs.Put(buf) }

// Close releases every mapping and copier.
func (r *Registry[C, D]) Close() error {
	r.mu.Lock()
	regions, copiers := r.regions, r.copiers
	r.regions, r.copiers = map[engines.MemoryID]*Region{}, map[int]C{}
	r.mu.Unlock()
	var errs []error
	for id, m := range regions {
		if m.Release != nil {
			if err := m.Release(); err != nil {
				errs = append(errs, fmt.Errorf("releasing %s: %w", id, err))
			}
		}
	}
	for _, c := range copiers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// WaitAfterCancel bounds how long a copy waits for queued GPU work after its context ended: a launched
// kernel cannot be recalled, and the contract says a copy returns only once the hardware has stopped touching
// the memory.
const WaitAfterCancel = 30 * time.Second

// Waiter is a submitted copy.
type Waiter interface {
	Wait(ctx context.Context) error
}

// WaitStopped waits for p; when ctx ends first it still waits (for up to WaitAfterCancel) for the GPU to stop.
func WaitStopped[P Waiter](ctx context.Context, p P) error {
	if err := p.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			wctx, cancel := context.WithTimeout(context.Background(), WaitAfterCancel)
			defer cancel()
			if werr := p.Wait(wctx); werr != nil && wctx.Err() != nil {
				return fmt.Errorf("%w; the GPU copy did not finish within %v afterwards", ctx.Err(), WaitAfterCancel)
			}
			return ctx.Err()
		}
		return err
	}
	return nil
}
