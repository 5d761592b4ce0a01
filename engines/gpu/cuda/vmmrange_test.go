// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// fakeMapper stands in for the driver's VMM calls: it keeps the state the driver would (imported handles,
// reservations, mappings), logs every call and fails the call named in failOn.
type fakeMapper struct {
	calls    []string
	failOn   string // a call as logged, e.g. "import fd=12" or "map +2097152"
	next     AllocHandle
	handles  map[AllocHandle]bool // imported, not yet released
	reserved map[DevicePtr]uint64
	mapped   map[DevicePtr]AllocHandle
	access   int
}

const fakeBase DevicePtr = 0x7f0000000000

func newFakeMapper() *fakeMapper {
	return &fakeMapper{next: 100, handles: map[AllocHandle]bool{}, reserved: map[DevicePtr]uint64{}, mapped: map[DevicePtr]AllocHandle{}}
}

func (f *fakeMapper) log(call string) error {
	f.calls = append(f.calls, call)
	if call == f.failOn {
		return &Error{Op: call, Code: ErrInvalidValue, Name: "CUDA_ERROR_INVALID_VALUE"}
	}
	return nil
}

func (f *fakeMapper) ImportPosixFD(fd int) (AllocHandle, error) {
	if err := f.log(fmt.Sprintf("import fd=%d", fd)); err != nil {
		return 0, err
	}
	f.next++
	f.handles[f.next] = true
	return f.next, nil
}

func (f *fakeMapper) MemRelease(h AllocHandle) error {
	if !f.handles[h] {
		return fmt.Errorf("release of handle %d, which is not held", h)
	}
	delete(f.handles, h)
	return f.log(fmt.Sprintf("release h=%d", h))
}

func (f *fakeMapper) MemAddressReserve(size, align uint64) (DevicePtr, error) {
	if err := f.log(fmt.Sprintf("reserve %d align %d", size, align)); err != nil {
		return 0, err
	}
	f.reserved[fakeBase] = size
	return fakeBase, nil
}

func (f *fakeMapper) MemAddressFree(ptr DevicePtr, size uint64) error {
	if f.reserved[ptr] != size {
		return fmt.Errorf("free of [%#x, +%d), which is not a reservation", ptr, size)
	}
	for p := range f.mapped {
		if p >= ptr && uint64(p-ptr) < size {
			return fmt.Errorf("free of [%#x, +%d) with %#x still mapped", ptr, size, p)
		}
	}
	delete(f.reserved, ptr)
	return f.log(fmt.Sprintf("free %d", size))
}

func (f *fakeMapper) MemMap(ptr DevicePtr, size uint64, h AllocHandle) error {
	if err := f.log(fmt.Sprintf("map +%d", ptr-fakeBase)); err != nil {
		return err
	}
	if !f.handles[h] || f.reserved[fakeBase] < uint64(ptr-fakeBase)+size {
		return fmt.Errorf("map of handle %d at %#x outside a reservation", h, ptr)
	}
	f.mapped[ptr] = h
	return nil
}

func (f *fakeMapper) MemUnmap(ptr DevicePtr, size uint64) error {
	if _, ok := f.mapped[ptr]; !ok {
		return fmt.Errorf("unmap of %#x, which is not mapped", ptr)
	}
	delete(f.mapped, ptr)
	return f.log(fmt.Sprintf("unmap +%d", ptr-fakeBase))
}

func (f *fakeMapper) MemSetAccess(ptr DevicePtr, size uint64, devs []Device) error {
	if err := f.log(fmt.Sprintf("access +%d %d devs=%v", ptr-fakeBase, size, devs)); err != nil {
		return err
	}
	f.access++
	return nil
}

// clean fails the test when the fake still holds anything.
func (f *fakeMapper) clean(t *testing.T, after string) {
	t.Helper()
	if len(f.handles)+len(f.reserved)+len(f.mapped) != 0 {
		t.Errorf("after %s: %d handles, %d reservations, %d mappings left behind (calls %q)",
			after, len(f.handles), len(f.reserved), len(f.mapped), f.calls)
	}
}

const mib2 = 2 << 20

// Three allocations are imported, mapped back to back in one reservation with one access grant, and released
// in reverse: every mapping unmapped on its own, the range freed, every handle released.
func TestImportRangeMapsBackToBackAndReleasesEverything(t *testing.T) {
	f := newFakeMapper()
	r, err := ImportRange(context.Background(), f, []int{7, 8, 9}, 10*mib2, mib2, []Device{0, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"import fd=7", "import fd=8", "import fd=9", "reserve 62914560 align 2097152",
		"map +0", "map +20971520", "map +41943040", "access +0 62914560 devs=[0 3]"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("calls %q, want %q", f.calls, want)
	}
	if r.Ptr != fakeBase || r.Size() != 3*10*mib2 || !slices.Equal(r.Handles, []AllocHandle{101, 102, 103}) {
		t.Fatalf("range %+v", r)
	}
	for i, h := range r.Handles {
		if f.mapped[r.Ptr+DevicePtr(uint64(i)*r.AllocSize)] != h {
			t.Fatalf("allocation %d (handle %d) is not mapped at +%d", i, h, uint64(i)*r.AllocSize)
		}
	}
	f.calls = nil
	if err := r.Release(f); err != nil {
		t.Fatal(err)
	}
	want = []string{"unmap +41943040", "unmap +20971520", "unmap +0", "free 62914560", "release h=103", "release h=102", "release h=101"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("release calls %q, want %q", f.calls, want)
	}
	f.clean(t, "release")
}

// A failure at any step undoes everything done before it and names the step.
func TestImportRangeUndoesEverythingWhenAStepFails(t *testing.T) {
	steps := []struct{ call, says string }{
		{"import fd=5", "importing VMM allocation 0 of 3"},
		{"import fd=6", "importing VMM allocation 1 of 3"},
		{"import fd=7", "importing VMM allocation 2 of 3"},
		{"reserve 12582912 align 2097152", "reserving 12582912 bytes for 3 VMM allocations"},
		{"map +0", "mapping VMM allocation 0 of 3 at offset 0"},
		{"map +4194304", "mapping VMM allocation 1 of 3 at offset 4194304"},
		{"map +8388608", "mapping VMM allocation 2 of 3 at offset 8388608"},
		{"access +0 12582912 devs=[1]", "granting 1 GPUs access to 3 VMM allocations"},
	}
	for _, st := range steps {
		f := newFakeMapper()
		f.failOn = st.call
		r, err := ImportRange(context.Background(), f, []int{5, 6, 7}, 2*mib2, mib2, []Device{1})
		if err == nil || r != nil {
			t.Fatalf("%s failing: range %+v, err %v", st.call, r, err)
		}
		if !strings.Contains(err.Error(), st.says) || !IsResult(err, ErrInvalidValue) {
			t.Errorf("%s failing: %v, want it to say %q and carry the driver's result", st.call, err, st.says)
		}
		f.clean(t, st.call+" failed")
		if f.access != 0 && st.call != "access +0 12582912 devs=[1]" {
			t.Errorf("%s failing: access granted anyway", st.call)
		}
	}
}

// A cancelled context stops the import part-way and leaves nothing behind.
func TestImportRangeStopsWhenTheContextEnds(t *testing.T) {
	f := newFakeMapper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ImportRange(ctx, f, []int{5, 6}, mib2, mib2, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled import: %v", err)
	}
	if len(f.calls) != 0 {
		t.Fatalf("cancelled import called the driver: %q", f.calls)
	}
	f.clean(t, "cancelled import")
}

// Malformed requests are refused before any driver call.
func TestImportRangeRefusesBadShapes(t *testing.T) {
	many := make([]int, MaxRangeAllocations+1)
	cases := []struct {
		name        string
		fds         []int
		size, align uint64
		says        string
	}{
		{"no allocations", nil, mib2, mib2, "no allocations"},
		{"too many", many, mib2, mib2, "at most 8192"},
		{"zero size", []int{1}, 0, mib2, "not a positive multiple"},
		{"unaligned size", []int{1, 2}, mib2 + 4096, mib2, "not a positive multiple of the granularity 2097152"},
		{"no granularity", []int{1}, mib2, 0, "not a positive multiple"},
		{"overflow", []int{1, 2, 3}, 1 << 63, 1 << 21, "overflow"},
	}
	for _, tc := range cases {
		f := newFakeMapper()
		_, err := ImportRange(context.Background(), f, tc.fds, tc.size, tc.align, nil)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.says)
		}
		if len(f.calls) != 0 {
			t.Errorf("%s: driver called: %q", tc.name, f.calls)
		}
	}
}

// *Driver is a RangeMapper: the backends map through it.
var _ RangeMapper = (*Driver)(nil)
