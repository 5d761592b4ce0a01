// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// fakeDriver stands in for the CUDA driver at the hardware edge: device memory is host bytes keyed by address,
// handles, contexts and streams are counted so tests can see that nothing leaks.
type fakeDriver struct {
	busIDs      []string
	granularity uint64
	noFabric    bool  // HANDLE_TYPE_FABRIC_SUPPORTED reads 0
	refuse      error // MemCreate's answer to the fabric handle type
	createErr   map[int]error
	// failAt, when positive, makes the failAt-th MemCreate fail (out of memory partway through a pool).
	failAt    int
	creates   int
	exportErr error // ExportFabric's answer
	zeroErr   error

	mu       sync.Mutex
	mem      map[cuda.DevicePtr][]byte
	handles  map[cuda.AllocHandle]int // live handle -> handle types
	next     uint64
	contexts int
	streams  int // live streams
	created  []int
}

func newFake(busIDs ...string) *fakeDriver {
	return &fakeDriver{busIDs: busIDs, granularity: 2 << 20, createErr: map[int]error{},
		mem: map[cuda.DevicePtr][]byte{}, handles: map[cuda.AllocHandle]int{}, next: 0x7f0000000000}
}

func (f *fakeDriver) DeviceCount() (int, error) { return len(f.busIDs), nil }
func (f *fakeDriver) DeviceGet(i int) (cuda.Device, error) {
	if i < 0 || i >= len(f.busIDs) {
		return 0, &cuda.Error{Op: "cuDeviceGet", Code: cuda.ErrInvalidDevice, Name: "CUDA_ERROR_INVALID_DEVICE"}
	}
	return cuda.Device(i), nil
}
func (f *fakeDriver) DevicePCIBusID(d cuda.Device) (string, error) { return f.busIDs[d], nil }
func (f *fakeDriver) DeviceAttribute(d cuda.Device, attr int) (int, error) {
	if attr == cuda.AttrHandleTypeFabricSupported && !f.noFabric {
		return 1, nil
	}
	return 0, nil
}
func (f *fakeDriver) CanAccessPeer(d, peer cuda.Device) (bool, error) { return true, nil }
func (f *fakeDriver) PrimaryContextRetain(d cuda.Device) (cuda.Context, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.contexts++
	return cuda.Context(d + 1), nil
}
func (f *fakeDriver) PrimaryContextRelease(cuda.Device) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.contexts--
	return nil
}
func (f *fakeDriver) WithContext(_ cuda.Context, fn func() error) error { return fn() }
func (f *fakeDriver) StreamCreate() (cuda.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streams++
	return cuda.Stream(f.streams), nil
}
func (f *fakeDriver) StreamDestroy(cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streams--
	return nil
}
func (f *fakeDriver) StreamSynchronize(cuda.Stream) error          { return nil }
func (f *fakeDriver) Granularity(cuda.Device, int) (uint64, error) { return f.granularity, nil }
func (f *fakeDriver) MemCreate(d cuda.Device, size uint64, types int) (cuda.AllocHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, types)
	if types&cuda.HandleTypeFabric != 0 && f.refuse != nil {
		return 0, f.refuse
	}
	if err := f.createErr[int(d)]; err != nil {
		return 0, err
	}
	if f.creates++; f.failAt > 0 && f.creates == f.failAt {
		return 0, &cuda.Error{Op: "cuMemCreate", Code: cuda.ErrOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	f.next++
	h := cuda.AllocHandle(f.next)
	f.handles[h] = types
	return h, nil
}
func (f *fakeDriver) MemRelease(h cuda.AllocHandle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.handles[h]; !ok {
		return fmt.Errorf("release of unknown handle %d", h)
	}
	delete(f.handles, h)
	return nil
}
func (f *fakeDriver) MapHandle(h cuda.AllocHandle, size, align uint64, devs []cuda.Device) (cuda.DevicePtr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next = (f.next + 1<<32) &^ (1<<32 - 1)
	p := cuda.DevicePtr(f.next)
	b := make([]byte, size)
	for i := range b {
		b[i] = 0xee // stale bytes of an earlier process: the pool must clear them
	}
	f.mem[p] = b
	return p, nil
}
func (f *fakeDriver) UnmapRange(p cuda.DevicePtr, size uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mem[p]; !ok {
		return fmt.Errorf("unmap of unknown range %#x", p)
	}
	delete(f.mem, p)
	return nil
}

// ExportPosixFD hands out a memfd named after the fake, so tests can count the descriptors still open.
func (f *fakeDriver) ExportPosixFD(cuda.AllocHandle) (int, error) {
	return unix.MemfdCreate(f.fdName(), unix.MFD_CLOEXEC)
}
func (f *fakeDriver) fdName() string { return fmt.Sprintf("fake-vmm-%p", f) }
func (f *fakeDriver) ExportFabric(cuda.AllocHandle) (cuda.FabricHandle, error) {
	return cuda.FabricHandle{1}, f.exportErr
}
func (f *fakeDriver) MemsetD8Async(p cuda.DevicePtr, v byte, n uint64, _ cuda.Stream) error {
	if f.zeroErr != nil {
		return f.zeroErr
	}
	b := f.at(p, n)
	for i := range b {
		b[i] = v
	}
	return nil
}

// at is the fake device memory [p, p+n).
func (f *fakeDriver) at(p cuda.DevicePtr, n uint64) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	for base, b := range f.mem {
		if p >= base && uint64(p-base)+n <= uint64(len(b)) {
			return b[p-base : uint64(p-base)+n]
		}
	}
	panic(fmt.Sprintf("fake device: [%#x, +%d) is not mapped", p, n))
}

func (f *fakeDriver) leaks() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	fds := openMemfds(f.fdName())
	if len(f.handles) != 0 || len(f.mem) != 0 || f.contexts != 0 || f.streams != 0 || fds != 0 {
		return fmt.Sprintf("%d handles, %d mappings, %d contexts, %d streams, %d exported fds still held", len(f.handles), len(f.mem), f.contexts, f.streams, fds)
	}
	return ""
}

func TestVMMPoolLendsAlignedSlicesOnTheNamedGPU(t *testing.T) {
	drv := newFake("0000:1B:00.0", "0000:2C:00.0")
	// The agent's indexes (3, 5) are not CUDA's ordinals; PCI addresses match case-insensitively.
	p, err := NewGPU(drv, []GPUTarget{{Index: 3, BusID: "0000:2c:00.0"}, {Index: 5, BusID: "0000:1b:00.0"}}, 1<<20+1)
	if err != nil {
		t.Fatal(err)
	}
	if total, free := p.Usage(); total != 4<<20 || free != 4<<20 {
		t.Fatalf("usage %d free of %d, want 2 GPUs × 2 MiB (rounded up to the granularity)", free, total)
	}
	a, err := p.AllocateOn("pod/a", 5, 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.AllocateOn("pod/a", 5, SliceAlign+1)
	if err != nil {
		t.Fatal(err)
	}
	if a.GPU != 5 || a.Kind != GPU || a.BusID != "0000:1b:00.0" || a.AllocSize != 2<<20 || a.Length != 1000 || a.File == nil {
		t.Fatalf("slice %+v: want GPU 5 at 0000:1b:00.0, 1000 bytes of a 2 MiB allocation with its fd", a)
	}
	if a.Offset%SliceAlign != 0 || b.Offset%SliceAlign != 0 || a.Offset == b.Offset || b.Offset < a.Offset+SliceAlign {
		t.Fatalf("offsets %d and %d: want distinct, non-overlapping %d-aligned offsets", a.Offset, b.Offset, SliceAlign)
	}
	if b.Ptr != a.Ptr-a.Offset+b.Offset {
		t.Fatalf("slice pointers %#x and %#x do not sit at their offsets in one mapping", a.Ptr, b.Ptr)
	}
	if !a.FabricExportable || a.FabricReason != "" {
		t.Fatalf("fabric-capable driver: exportable %v, reason %q", a.FabricExportable, a.FabricReason)
	}
	if got := drv.at(cuda.DevicePtr(a.Ptr), a.Length); got[0] != 0 || got[999] != 0 {
		t.Fatal("pool memory was not zeroed at creation")
	}
	// Accounting: GPU 5 lost one 64 KiB and one 128 KiB span; GPU 3 is untouched.
	if _, free := p.Usage(); free != 4<<20-3*SliceAlign {
		t.Fatalf("free %d, want %d", free, 4<<20-3*SliceAlign)
	}
	for _, d := range p.Devices() {
		want := uint64(2 << 20)
		if d.Index == 5 {
			want -= 3 * SliceAlign
		}
		if d.Free != want {
			t.Fatalf("GPU %d: %d free, want %d", d.Index, d.Free, want)
		}
	}
	// A borrower's bytes never reach the next borrower.
	copy(drv.at(cuda.DevicePtr(b.Ptr), 4), "kv!!")
	if err := p.Free(b.ID); err != nil {
		t.Fatal(err)
	}
	if got := drv.at(cuda.DevicePtr(b.Ptr), 4); string(got) != "\x00\x00\x00\x00" {
		t.Fatalf("freed slice holds %q, want zeros", got)
	}
	if err := p.Free(b.ID); err == nil {
		t.Fatal("double free accepted")
	}
	c, err := p.AllocateOn("pod/a", 5, 2*SliceAlign)
	if err != nil || c.Offset != b.Offset {
		t.Fatalf("reallocation: %+v, %v; want the freed range at %d again", c, err, b.Offset)
	}
	// Allocate without an index takes the GPU with the most room.
	d, err := p.Allocate("pod/a", 1)
	if err != nil || d.GPU != 3 {
		t.Fatalf("Allocate: %+v, %v; want GPU 3 (emptier)", d, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if l := drv.leaks(); l != "" {
		t.Fatalf("after Close: %s", l)
	}
	if _, err := p.AllocateOn("pod/a", 3, 1); err == nil {
		t.Fatal("allocation from a closed pool accepted")
	}
}

func TestVMMPoolBadRequestsChangeNothing(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	p, err := NewGPU(drv, []GPUTarget{{Index: 0, BusID: "0000:1b:00.0"}}, 4*SliceAlign)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	held, err := p.AllocateOn("pod/a", 0, SliceAlign)
	if err != nil {
		t.Fatal(err)
	}
	_, freeBefore := p.Usage()
	for _, tc := range []struct {
		name  string
		owner string
		gpu   int
		size  uint64
		is    error
		words string
	}{
		{"size 0", "pod/a", 0, 0, nil, "size must be positive"},
		{"no owner", "", 0, 4096, nil, "owner is required"},
		{"larger than a slab", "pod/a", 0, 2<<20 + 1, ErrTooLarge, "a slab holds 2097152 bytes (agent flag --pool-slab-bytes)"},
		{"unknown GPU index", "pod/a", 7, 4096, ErrNoSuchGPU, "GPUs [0]"},
		{"negative GPU index", "pod/a", -1, 4096, ErrNoSuchGPU, "GPU -1"},
		{"more than its slab has left", "pod/a", 0, 2 << 20, ErrExhausted, "the 1 slabs it holds have no room"},
		{"another owner, no free slab", "pod/b", 0, 4096, ErrExhausted, "1 of 1 slabs"},
	} {
		s, err := p.AllocateOn(tc.owner, tc.gpu, tc.size)
		if err == nil {
			t.Errorf("%s: lent %+v", tc.name, s)
			continue
		}
		if (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %v, want %v mentioning %q", tc.name, err, tc.is, tc.words)
		}
		if _, free := p.Usage(); free != freeBefore {
			t.Errorf("%s: free bytes went from %d to %d", tc.name, freeBefore, free)
		}
	}
	if err := p.Free("gpu0-999"); err == nil || !strings.Contains(err.Error(), "not allocated") {
		t.Errorf("freeing an unknown slice: %v", err)
	}
	if err := p.Free(held.ID); err != nil {
		t.Fatalf("the held slice is still lent and freeable: %v", err)
	}
}

func TestVMMPoolFallsBackToPosixFDWhenFabricIsRefused(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	drv.refuse = &cuda.Error{Op: "cuMemCreate", Code: cuda.ErrNotPermitted, Name: "CUDA_ERROR_NOT_PERMITTED"}
	p, err := NewGPU(drv, []GPUTarget{{Index: 0}}, 1<<20)
	if err != nil {
		t.Fatalf("a refused fabric handle type must not stop the pool: %v", err)
	}
	defer p.Close()
	if fmt.Sprint(drv.created) != fmt.Sprint([]int{cuda.HandleTypePosixFD | cuda.HandleTypeFabric, cuda.HandleTypePosixFD}) {
		t.Fatalf("handle types asked for: %v, want fabric|fd, then fd alone", drv.created)
	}
	d := p.Devices()[0]
	if d.FabricExportable || !strings.Contains(d.FabricReason, "CUDA_ERROR_NOT_PERMITTED") || !strings.Contains(d.FabricReason, "IMEX") {
		t.Fatalf("device %+v: want not exportable, with the driver's refusal and what is missing", d)
	}
	s, err := p.AllocateOn("pod/a", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if s.FabricExportable || s.FabricReason != d.FabricReason {
		t.Fatalf("slice says exportable=%v reason=%q, want the pool's reason", s.FabricExportable, s.FabricReason)
	}
}

func TestVMMPoolRecordsWhyFabricIsMissing(t *testing.T) {
	t.Run("GPU without fabric handles", func(t *testing.T) {
		drv := newFake("0000:1b:00.0")
		drv.noFabric = true
		p, err := NewGPU(drv, []GPUTarget{{Index: 0}}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if d := p.Devices()[0]; d.FabricExportable || !strings.Contains(d.FabricReason, "does not offer fabric handles") {
			t.Fatalf("device %+v", d)
		}
		if len(drv.created) != 1 || drv.created[0] != cuda.HandleTypePosixFD {
			t.Fatalf("asked for handle types %v; a GPU without fabric support gets fd only", drv.created)
		}
	})
	t.Run("export fails", func(t *testing.T) {
		drv := newFake("0000:1b:00.0")
		drv.exportErr = &cuda.Error{Op: "cuMemExportToShareableHandle(FABRIC)", Code: cuda.ErrNotPermitted, Name: "CUDA_ERROR_NOT_PERMITTED"}
		p, err := NewGPU(drv, []GPUTarget{{Index: 0}}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if d := p.Devices()[0]; d.FabricExportable || !strings.Contains(d.FabricReason, "exporting one failed") {
			t.Fatalf("device %+v", d)
		}
	})
}

func TestVMMPoolCreationFailureUndoesEverything(t *testing.T) {
	drv := newFake("0000:1b:00.0", "0000:2c:00.0")
	drv.createErr[1] = &cuda.Error{Op: "cuMemCreate", Code: cuda.ErrOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	_, err := NewGPU(drv, []GPUTarget{{Index: 0}, {Index: 1}}, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "GPU 1") || !strings.Contains(err.Error(), "OUT_OF_MEMORY") {
		t.Fatalf("second GPU out of memory: %v", err)
	}
	if l := drv.leaks(); l != "" {
		t.Fatalf("after a failed creation: %s", l)
	}
	for _, tc := range []struct {
		name    string
		targets []GPUTarget
		size    uint64
		words   string
	}{
		{"zero size", []GPUTarget{{Index: 0}}, 0, "must be positive"},
		{"no GPUs", nil, 1 << 20, "no GPUs"},
		{"unknown PCI address", []GPUTarget{{Index: 0, BusID: "0000:99:00.0"}}, 1 << 20, "no CUDA device at PCI address 0000:99:00.0"},
	} {
		if _, err := NewGPU(newFake("0000:1b:00.0"), tc.targets, tc.size); err == nil || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.words)
		}
	}
}

func TestVMMPoolKeepsRangesItCouldNotZeroOutOfThePool(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	p, err := NewGPU(drv, []GPUTarget{{Index: 0}}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := p.AllocateOn("pod/a", 0, SliceAlign)
	if err != nil {
		t.Fatal(err)
	}
	drv.zeroErr = &cuda.Error{Op: "cuMemsetD8", Code: cuda.ErrIllegalAddress, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"}
	if err := p.Free(s.ID); err == nil || !strings.Contains(err.Error(), "kept out of the pool") {
		t.Fatalf("free with a failing memset: %v", err)
	}
	drv.zeroErr = nil
	if total, free := p.Usage(); free != total-SliceAlign {
		t.Fatalf("free %d of %d: the unzeroed range came back", free, total)
	}
	if err := p.Free(s.ID); err == nil {
		t.Fatal("the quarantined slice was freed twice")
	}
	// The slab still holds the owner's unzeroed bytes: it is never lent to anyone else.
	if _, err := p.AllocateOn("pod/b", 0, 4096); !errors.Is(err, ErrExhausted) {
		t.Fatalf("another owner after a failed zeroing: %v, want ErrExhausted", err)
	}
}

// slabOf is the device address of the slab holding a slice: slices of one slab share it.
func slabOf(s *Slice) uint64 { return s.Ptr - s.Offset }

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestVMMPoolSlabSizes(t *testing.T) {
	const g, mib = 2 << 20, 1 << 20
	for _, tc := range []struct {
		name             string
		total, requested uint64
		want             []uint64
		words            string
	}{
		{"default: an eighth", 64 * mib, 0, []uint64{8 * mib, 8 * mib, 8 * mib, 8 * mib, 8 * mib, 8 * mib, 8 * mib, 8 * mib}, ""},
		{"default rounds up to the granularity; the last slab is the rest", 100 * mib, 0,
			[]uint64{14 * mib, 14 * mib, 14 * mib, 14 * mib, 14 * mib, 14 * mib, 14 * mib, 2 * mib}, ""},
		{"default: at least one granularity", 4 * mib, 0, []uint64{g, g}, ""},
		{"requested, rounded up", 8 * mib, 3 * mib, []uint64{4 * mib, 4 * mib}, ""},
		{"requested larger than the GPU's share", 8 * mib, 1 << 40, []uint64{8 * mib}, ""},
		{"requested below the granularity", 4 * mib, 1, []uint64{g, g}, ""},
		{"too many slabs", 4096 * mib, g, nil, "more than 1024"},
	} {
		got, err := slabSizes(tc.total, g, tc.requested)
		if tc.words != "" {
			if err == nil || !strings.Contains(err.Error(), tc.words) || !strings.Contains(err.Error(), "--pool-slab-bytes") {
				t.Errorf("%s: %v, %v; want an error naming the flag and %q", tc.name, got, err, tc.words)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestVMMPoolOwnersNeverShareASlab(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	p, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}}, GPUOptions{PerGPU: 8 << 20, SlabBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if d := p.Devices()[0]; d.Slabs != 4 || d.SlabBytes != 2<<20 || d.FreeSlabs != 4 || d.Total != 8<<20 {
		t.Fatalf("device %+v: want 4 free slabs of 2 MiB", d)
	}
	if len(drv.handles) != 4 {
		t.Fatalf("%d VMM allocations, want one per slab", len(drv.handles))
	}
	owner := map[string]string{}
	var lent []*Slice
	take := func(who string, size uint64) *Slice {
		t.Helper()
		s, err := p.AllocateOn(who, 0, size)
		if err != nil {
			t.Fatalf("%s allocating %d bytes: %v", who, size, err)
		}
		owner[s.ID] = who
		lent = append(lent, s)
		return s
	}
	a1 := take("pod/a", 512<<10)
	a2 := take("pod/a", 512<<10)
	b1 := take("pod/b", 4096)
	a3 := take("pod/a", 512<<10)
	if slabOf(a1) != slabOf(a2) || slabOf(a2) != slabOf(a3) || a1.File != a3.File {
		t.Fatal("one owner's small slices were spread over several slabs")
	}
	if slabOf(b1) == slabOf(a1) || b1.File == a1.File {
		t.Fatal("a second owner was lent a slice of the first owner's slab")
	}
	// A's slab has 512 KiB left: a 1 MiB slice opens a second slab for A rather than using B's.
	a4 := take("pod/a", 1<<20)
	b2 := take("pod/b", 1<<20)
	if slabOf(a4) == slabOf(a1) || slabOf(a4) == slabOf(b1) || slabOf(b2) != slabOf(b1) {
		t.Fatalf("slab bases a1 %#x a4 %#x b1 %#x b2 %#x", slabOf(a1), slabOf(a4), slabOf(b1), slabOf(b2))
	}
	if d := p.Devices()[0]; d.FreeSlabs != 1 {
		t.Fatalf("device %+v: want 1 free slab (A holds 2, B holds 1)", d)
	}
	c1 := take("pod/c", 2<<20)
	// Every pair of slices of different owners: different slabs, different fds (different files, not just
	// different descriptors of one), and each fd is of the slab's size.
	for i, x := range lent {
		if x.AllocSize != 2<<20 || x.Offset+x.Length > x.AllocSize {
			t.Errorf("slice %s: [%d, +%d) of a %d-byte allocation", x.ID, x.Offset, x.Length, x.AllocSize)
		}
		for _, y := range lent[i+1:] {
			if owner[x.ID] == owner[y.ID] {
				continue
			}
			if slabOf(x) == slabOf(y) || inode(t, x.File) == inode(t, y.File) {
				t.Errorf("%s (%s) and %s (%s) share a slab", x.ID, owner[x.ID], y.ID, owner[y.ID])
			}
		}
	}
	// Full: a fourth owner gets nothing, and the error says why; C, whose slab is full, gets nothing either.
	if _, err := p.AllocateOn("pod/d", 0, 1); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "4 of 4 slabs") {
		t.Errorf("a fourth owner with every slab lent: %v", err)
	}
	if _, err := p.Allocate("pod/c", 1); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "pod/c") {
		t.Errorf("C with its slab full: %v", err)
	}
	// An owner can still fill its own slabs.
	take("pod/b", 512<<10)
	if _, free := p.Usage(); free != 8<<20-(3*512<<10+1<<20+SliceAlign+1<<20+2<<20+512<<10) {
		t.Errorf("free bytes %d", free)
	}
	_ = c1
}

func TestVMMPoolSlabFreedByItsLastSliceIsRenewedAndLentToAnotherOwner(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	p, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}}, GPUOptions{PerGPU: 4 << 20, SlabBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a1, err := p.AllocateOn("pod/a", 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := p.AllocateOn("pod/a", 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocateOn("pod/b", 0, 2<<20); err != nil {
		t.Fatal(err)
	}
	copy(drv.at(cuda.DevicePtr(a1.Ptr), 6), "secret")
	copy(drv.at(cuda.DevicePtr(a2.Ptr+a2.Length-6), 6), "secret")
	if err := p.Free(a1.ID); err != nil {
		t.Fatal(err)
	}
	// A still holds a slice of the slab: it is not anyone else's yet.
	if _, err := p.AllocateOn("pod/c", 0, 4096); !errors.Is(err, ErrExhausted) {
		t.Fatalf("C while A still holds a slice of the slab: %v, want ErrExhausted", err)
	}
	if got := drv.at(cuda.DevicePtr(a1.Ptr), 6); string(got) != "\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("freed slice holds %q", got)
	}
	if err := p.Free(a2.ID); err != nil {
		t.Fatal(err)
	}
	if d := p.Devices()[0]; d.FreeSlabs != 1 || d.Free != 2<<20 {
		t.Fatalf("device %+v: A's slab should be free again", d)
	}
	c, err := p.AllocateOn("pod/c", 0, 2<<20)
	if err != nil {
		t.Fatalf("C after A gave its slab back: %v", err)
	}
	// A mapped the whole slab and may keep that mapping (or a copy of the fd) after Release: C gets new memory
	// and a new fd, and the pool gave A's allocation up, so it holds as many allocations as before.
	if slabOf(c) == slabOf(a1) || c.File == a1.File {
		t.Fatalf("C got A's former allocation %#x (fd %v): a borrower that kept its mapping could read C's bytes", slabOf(c), c.File)
	}
	if len(drv.handles) != 2 {
		t.Fatalf("%d allocations held after renewing a slab, want 2 (the old one released)", len(drv.handles))
	}
	// The whole slab C can map through its fd is zero: nothing of A's survives.
	for i, v := range drv.at(cuda.DevicePtr(slabOf(c)), c.AllocSize) {
		if v != 0 {
			t.Fatalf("byte %d of the slab lent to C is %#x", i, v)
		}
	}
}

func TestVMMPoolRefusesRequestsLargerThanASlab(t *testing.T) {
	drv := newFake("0000:1b:00.0", "0000:2c:00.0")
	p, err := NewGPU(drv, []GPUTarget{{Index: 0}, {Index: 1}}, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Default: an eighth of 16 MiB.
	for _, try := range []func() error{
		func() error { _, err := p.AllocateOn("pod/a", 1, 2<<20+1); return err },
		func() error { _, err := p.Allocate("pod/a", 2<<20+1); return err },
	} {
		err := try()
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "a slab holds 2097152 bytes") || !strings.Contains(err.Error(), "--pool-slab-bytes") {
			t.Errorf("a request one byte over the slab: %v", err)
		}
	}
	if s, err := p.Allocate("pod/a", 2<<20); err != nil || s.AllocSize != 2<<20 {
		t.Errorf("a request of exactly one slab: %+v, %v", s, err)
	}
	if _, free := p.Usage(); free != 32<<20-2<<20 {
		t.Errorf("free %d after refusals and one slab lent", free)
	}
}

func TestVMMPoolAllocatePrefersTheGPUWithRoomForTheOwner(t *testing.T) {
	drv := newFake("0000:1b:00.0", "0000:2c:00.0")
	p, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}, {Index: 1}}, GPUOptions{PerGPU: 2 << 20, SlabBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := p.Allocate("pod/a", 4096)
	if err != nil {
		t.Fatal(err)
	}
	// The other GPU's only slab is the one B can have; A's GPU has nothing for B.
	b, err := p.Allocate("pod/b", 4096)
	if err != nil || b.GPU == a.GPU {
		t.Fatalf("B: %+v, %v; want the GPU A does not hold", b, err)
	}
	if _, err := p.Allocate("pod/c", 4096); !errors.Is(err, ErrExhausted) {
		t.Fatalf("C with both GPUs' slabs lent: %v", err)
	}
	if again, err := p.Allocate("pod/a", 4096); err != nil || again.GPU != a.GPU {
		t.Fatalf("A again: %+v, %v; want A's own slab", again, err)
	}
}

func TestVMMPoolCloseReleasesEverySlab(t *testing.T) {
	drv := newFake("0000:1b:00.0", "0000:2c:00.0")
	p, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}, {Index: 1}}, GPUOptions{PerGPU: 16 << 20, SlabBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if n := openMemfds(drv.fdName()); n != 8 || len(drv.handles) != 8 || len(drv.mem) != 8 {
		t.Fatalf("%d fds, %d handles, %d mappings open; want 8 slabs (4 per GPU)", n, len(drv.handles), len(drv.mem))
	}
	// Slices still lent do not keep anything of the agent's alive.
	for _, who := range []string{"pod/a", "pod/b", "pod/c"} {
		if _, err := p.Allocate(who, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if l := drv.leaks(); l != "" {
		t.Fatalf("after Close: %s", l)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestVMMPoolFailingPartwayThroughTheSlabsUndoesEverything(t *testing.T) {
	drv := newFake("0000:1b:00.0", "0000:2c:00.0")
	drv.failAt = 6 // the second slab of the second GPU
	_, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}, {Index: 1}}, GPUOptions{PerGPU: 8 << 20, SlabBytes: 2 << 20})
	if err == nil || !strings.Contains(err.Error(), "GPU 1") || !strings.Contains(err.Error(), "slab 2 of 4") || !strings.Contains(err.Error(), "OUT_OF_MEMORY") {
		t.Fatalf("out of memory at the sixth slab: %v", err)
	}
	if l := drv.leaks(); l != "" {
		t.Fatalf("after a failed creation: %s", l)
	}
}

func TestVMMPoolFabricRefusalAppliesToEverySlab(t *testing.T) {
	drv := newFake("0000:1b:00.0")
	drv.refuse = &cuda.Error{Op: "cuMemCreate", Code: cuda.ErrNotPermitted, Name: "CUDA_ERROR_NOT_PERMITTED"}
	p, err := NewGPUWithOptions(drv, []GPUTarget{{Index: 0}}, GPUOptions{PerGPU: 6 << 20, SlabBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fd := cuda.HandleTypePosixFD
	if fmt.Sprint(drv.created) != fmt.Sprint([]int{fd | cuda.HandleTypeFabric, fd, fd, fd}) {
		t.Fatalf("handle types asked for: %v; want one refused fabric attempt, then fd only for all 3 slabs", drv.created)
	}
	if d := p.Devices()[0]; d.FabricExportable || d.Slabs != 3 {
		t.Fatalf("device %+v", d)
	}
}

// openMemfds counts this process's open descriptors of memfds named name.
func openMemfds(name string) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		panic(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "/memfd:"+name+" (deleted)" {
			n++
		}
	}
	return n
}
