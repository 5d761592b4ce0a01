package poolmem

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines/cuda"
)

// fakeDriver stands in for the CUDA driver at the hardware edge: device memory is host bytes keyed by address,
// handles and contexts are counted so tests can see that nothing leaks.
type fakeDriver struct {
	busIDs      []string
	granularity uint64
	noFabric    bool  // HANDLE_TYPE_FABRIC_SUPPORTED reads 0
	refuse      error // MemCreate's answer to the fabric handle type
	createErr   map[int]error
	exportErr   error // ExportFabric's answer
	zeroErr     error

	mu       sync.Mutex
	mem      map[cuda.DevicePtr][]byte
	handles  map[cuda.AllocHandle]int // live handle -> handle types
	next     uint64
	contexts int
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
func (f *fakeDriver) CtxSynchronize() error                             { return nil }
func (f *fakeDriver) Granularity(cuda.Device, int) (uint64, error)      { return f.granularity, nil }
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
func (f *fakeDriver) ExportPosixFD(cuda.AllocHandle) (int, error) { return memfdCreate("fake-vmm") }
func (f *fakeDriver) ExportFabric(cuda.AllocHandle) (cuda.FabricHandle, error) {
	return cuda.FabricHandle{1}, f.exportErr
}
func (f *fakeDriver) MemsetD8(p cuda.DevicePtr, v byte, n uint64) error {
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
	if len(f.handles) != 0 || len(f.mem) != 0 || f.contexts != 0 {
		return fmt.Sprintf("%d handles, %d mappings, %d contexts still held", len(f.handles), len(f.mem), f.contexts)
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
	a, err := p.AllocateOn(5, 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.AllocateOn(5, SliceAlign+1)
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
	c, err := p.AllocateOn(5, 2*SliceAlign)
	if err != nil || c.Offset != b.Offset {
		t.Fatalf("reallocation: %+v, %v; want the freed range at %d again", c, err, b.Offset)
	}
	// Allocate without an index takes the GPU with the most room.
	d, err := p.Allocate(1)
	if err != nil || d.GPU != 3 {
		t.Fatalf("Allocate: %+v, %v; want GPU 3 (emptier)", d, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if l := drv.leaks(); l != "" {
		t.Fatalf("after Close: %s", l)
	}
	if _, err := p.AllocateOn(3, 1); err == nil {
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
	held, err := p.AllocateOn(0, SliceAlign)
	if err != nil {
		t.Fatal(err)
	}
	_, freeBefore := p.Usage()
	for _, tc := range []struct {
		name  string
		gpu   int
		size  uint64
		is    error
		words string
	}{
		{"size 0", 0, 0, nil, "size must be positive"},
		{"larger than the pool", 0, 2<<20 + 1, ErrExhausted, "holds 2097152 bytes"},
		{"unknown GPU index", 7, 4096, ErrNoSuchGPU, "GPUs [0]"},
		{"negative GPU index", -1, 4096, ErrNoSuchGPU, "GPU -1"},
		{"more than is free", 0, 2 << 20, ErrExhausted, "fragmented"},
	} {
		s, err := p.AllocateOn(tc.gpu, tc.size)
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
	s, err := p.AllocateOn(0, 10)
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
	s, err := p.AllocateOn(0, SliceAlign)
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
}
