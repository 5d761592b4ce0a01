// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package verbs

import (
	"strings"
	"testing"
	"unsafe"
)

func TestOpenMissingLibrarySaysWhy(t *testing.T) {
	_, err := Open("/nonexistent/libibverbs.so.1")
	if err == nil || !strings.HasPrefix(err.Error(), "no RDMA verbs library: ") {
		t.Fatalf("Open = %v", err)
	}
}

func TestMTUEnum(t *testing.T) {
	for bytes, want := range map[int]uint32{256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5, 9000: 5, 0: 1} {
		if got := mtuEnum(bytes); got != want {
			t.Errorf("mtuEnum(%d) = %d, want %d", bytes, got, want)
		}
	}
}

func TestStatusNames(t *testing.T) {
	if StatusRetryExcErr.String() != "transport retry counter exceeded" || Status(99).String() != "status 99" {
		t.Fatal("status names")
	}
}

// TestHardwareLoopback connects two queue pairs of the first active port to
// each other and moves bytes with an RDMA write and read. It needs an RDMA
// NIC; everywhere else it skips and says why.
func TestHardwareLoopback(t *testing.T) {
	l, err := Open("")
	if err != nil {
		t.Skipf("needs an RDMA NIC: %v", err)
	}
	names, err := l.DeviceNames()
	if err != nil {
		t.Skipf("needs an RDMA NIC: %v", err)
	}
	if len(names) == 0 {
		t.Skip("needs an RDMA NIC: libibverbs sees no RDMA devices")
	}
	var d *Device
	for _, n := range names {
		if d, err = l.OpenDevice(n, 1); err == nil {
			break
		}
		t.Logf("%s port 1: %v", n, err)
	}
	if d == nil {
		t.Skipf("needs an active RDMA port among %v", names)
	}
	defer d.Close()
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 13)
	}
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	ms, err := d.RegisterMemory(uint64(uintptr(unsafe.Pointer(&src[0]))), uint64(len(src)), acc)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	md, err := d.RegisterMemory(uint64(uintptr(unsafe.Pointer(&dst[0]))), uint64(len(dst)), acc)
	if err != nil {
		t.Fatal(err)
	}
	defer md.Close()
	a, err := d.CreateQP(16)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateQP(16)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close(); b.Close(); a.Destroy(); b.Destroy() }()
	if err := a.Connect(b.Info()); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(a.Info()); err != nil {
		t.Fatal(err)
	}
	wr := WorkRequest{ID: 1, Op: OpWrite, LocalAddr: uint64(uintptr(unsafe.Pointer(&src[0]))), LKey: ms.LKey(),
		Length: uint32(len(src)), RemoteAddr: uint64(uintptr(unsafe.Pointer(&dst[0]))), RKey: md.RKey()}
	if err := a.Post([]WorkRequest{wr}); err != nil {
		t.Fatal(err)
	}
	wc := make([]Completion, 1)
	for n := 0; n == 0; {
		if n, err = a.Poll(wc); err != nil {
			t.Fatal(err)
		}
	}
	if wc[0].Status != StatusSuccess || string(src) != string(dst) {
		t.Fatalf("RDMA write: %s, bytes equal %v", wc[0].Status, string(src) == string(dst))
	}
}
