// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"testing"
)

func fullDesc() MemoryDesc {
	d := MemoryDesc{
		ID: "node-a/42", Node: "node-a", Size: 1 << 30, FabricDomain: "ualink:6f1c-ppod/3",
		Location: Location{Kind: LocationGPU, Device: 5, Vendor: VendorAMD, BusID: "0000:c1:00.0"},
		Handles: Handles{
			IPC: bytes.Repeat([]byte{0xab}, IPCHandleSize), IPCOffset: 4096,
			Fabric: &FabricHandle{Offset: 2 << 20, AllocSize: 2 << 30},
			RDMA:   []RDMAKey{{Device: "mlx5_0", Addr: 0x7f0000000000, RKey: 0x1234}, {Device: "mlx5_1", Addr: 0x7f0000000000, RKey: 0x99}},
			TCP:    "10.1.2.3:7070",
		},
	}
	for i := range d.Handles.Fabric.Token {
		d.Handles.Fabric.Token[i] = byte(i)
	}
	return d
}

func TestDescRoundTripDropsLocalHandles(t *testing.T) {
	d := fullDesc()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d.Handles.Ptr = 0xdead0000
	d.Handles.VMM = &VMMHandle{FDs: []*os.File{f}, AllocSize: 2 << 30}
	b, err := MarshalDesc(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalDesc(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := d.Remote(); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if got.Handles.Ptr != 0 || got.Handles.VMM != nil {
		t.Fatal("process-local handles crossed the wire")
	}
}

func TestUnmarshalDescRejects(t *testing.T) {
	good, err := MarshalDesc(fullDesc())
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":         nil,
		"truncated":     good[:len(good)-1],
		"trailing byte": append(bytes.Clone(good), 0),
		"bad magic":     mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"newer version": mutate(func(b []byte) []byte { b[4] = 2; return b }),
		"oversized":     make([]byte, MaxDescWireSize+1),
	}
	for name, b := range cases {
		if _, err := UnmarshalDesc(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	bad := fullDesc()
	bad.Handles.IPC = []byte{1, 2, 3}
	if _, err := MarshalDesc(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("short IPC handle: %v", err)
	}
	bad = fullDesc()
	bad.Handles.Fabric.Offset = bad.Handles.Fabric.AllocSize
	if _, err := MarshalDesc(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("region outside its fabric allocation: %v", err)
	}
	bad = fullDesc()
	bad.Handles.TCP = "10.0.0.1:0"
	if _, err := MarshalDesc(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("port 0: %v", err)
	}
}

// FuzzUnmarshalDesc: whatever the decoder accepts is valid and re-encodes to the same bytes.
func FuzzUnmarshalDesc(f *testing.F) {
	full, _ := MarshalDesc(fullDesc())
	f.Add(full)
	host, _ := MarshalDesc(MemoryDesc{ID: "n/1", Node: "n", Location: Location{Kind: LocationHost}, Size: 1, Handles: Handles{TCP: "[::1]:1"}})
	f.Add(host)
	f.Add([]byte("FXMD\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := UnmarshalDesc(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("decode error %v is not ErrInvalid", err)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded an invalid descriptor: %v", err)
		}
		again, err := MarshalDesc(d)
		if err != nil {
			t.Fatalf("re-encoding a decoded descriptor: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("encoding not canonical:\n in %x\nout %x", b, again)
		}
	})
}
