// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// gpu opens the runtime and makes device 0 current on a locked thread, or
// skips with the reason.
func gpu(t *testing.T) (*Runtime, Device) {
	t.Helper()
	r, err := Load()
	if err != nil {
		t.Skipf("no AMD GPU (%v)", err)
	}
	n, err := r.DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no AMD GPU (hipGetDeviceCount: %d devices, %v)", n, err)
	}
	dev, err := r.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetDevice(dev); err != nil {
		t.Fatal(err)
	}
	return r, dev
}

func TestGPUDeviceFacts(t *testing.T) {
	r, dev := gpu(t)
	name, err := r.DeviceName(dev)
	if err != nil || name == "" {
		t.Fatalf("DeviceName = %q, %v", name, err)
	}
	bus, err := r.DevicePCIBusID(dev)
	if err != nil || len(bus) < len("0000:00:00.0") {
		t.Fatalf("DevicePCIBusID = %q, %v", bus, err)
	}
	mem, err := r.DeviceTotalMem(dev)
	if err != nil || mem == 0 {
		t.Fatalf("DeviceTotalMem = %d, %v", mem, err)
	}
	attrs := map[string]int{}
	for name, a := range map[string]int{"cc.major": AttrComputeCapabilityMajor, "cc.minor": AttrComputeCapabilityMinor,
		"cus": AttrMultiprocessorCount, "warp": AttrWarpSize, "pci.bus": AttrPCIBusID, "vmm": AttrVirtualMemoryManagement} {
		v, err := r.DeviceAttribute(dev, a)
		if err != nil {
			t.Fatalf("attribute %s: %v", name, err)
		}
		attrs[name] = v
	}
	if attrs["cus"] <= 0 || (attrs["warp"] != 32 && attrs["warp"] != 64) {
		t.Fatalf("implausible attributes %v", attrs)
	}
	// The bus number attribute must agree with the bus id string ("dddd:bb:dd.f").
	if want := strings.ToLower(bus[5:7]); want != strings.ToLower(hexByte(attrs["pci.bus"])) {
		t.Fatalf("hipDeviceAttributePciBusId = %d but bus id is %s", attrs["pci.bus"], bus)
	}
	t.Logf("device 0: %s at %s, %d GiB, HIP %d, driver %d, attributes %v", name, bus, mem>>30, r.RuntimeVersion(), r.DriverVersion(), attrs)
}

func hexByte(v int) string { return hex.EncodeToString([]byte{byte(v)}) }

func TestGPUMallocCopyRoundTrip(t *testing.T) {
	r, _ := gpu(t)
	const n = 1 << 20
	a, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(a) }()
	b, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(b) }()
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(rand.Uint32())
	}
	if err := r.MemcpyHtoD(a, src); err != nil {
		t.Fatal(err)
	}
	if err := r.Memcpy(uint64(b), uint64(a), n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := r.MemcpyDtoH(got, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("device-to-device copy corrupted the data")
	}
	base, size, err := r.AddressRange(b + 4096)
	if err != nil || base != b || size < n {
		t.Fatalf("AddressRange = %#x, %d, %v; want %#x, >= %d", base, size, err, b, n)
	}
}

func TestGPUPinnedAsyncCopyWithEvents(t *testing.T) {
	r, _ := gpu(t)
	const n = 4 << 20
	host, err := r.HostMalloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.HostFree(host) }()
	dev, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(dev) }()
	s, err := r.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.StreamDestroy(s) }()
	start, err := r.EventCreate(true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.EventDestroy(start) }()
	end, err := r.EventCreate(true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.EventDestroy(end) }()

	hb := unsafe.Slice((*byte)(HostPointer(host)), n)
	for i := range hb {
		hb[i] = byte(i * 7)
	}
	want := bytes.Clone(hb)
	if err := r.EventRecord(start, s); err != nil {
		t.Fatal(err)
	}
	if err := r.MemcpyAsync(uint64(dev), uint64(host), n, s); err != nil {
		t.Fatal(err)
	}
	if err := r.MemsetAsync(dev, 0xAB, 16, s); err != nil {
		t.Fatal(err)
	}
	if err := r.MemcpyAsync(uint64(host), uint64(dev), n, s); err != nil {
		t.Fatal(err)
	}
	if err := r.EventRecord(end, s); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, err := r.EventQuery(end)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("copies did not finish within 10 s")
		}
		time.Sleep(100 * time.Microsecond)
	}
	copy(want[:16], bytes.Repeat([]byte{0xAB}, 16))
	if !bytes.Equal(hb, want) {
		t.Fatal("pinned round trip corrupted the data")
	}
	ms, err := r.EventElapsed(start, end)
	if err != nil || ms <= 0 {
		t.Fatalf("EventElapsed = %v, %v", ms, err)
	}
	t.Logf("8 MiB through pinned memory in %.3f ms", ms)
}

func TestGPUCompileAndLaunchCopyKernel(t *testing.T) {
	r, _ := gpu(t)
	rtc, err := LoadRTC()
	if err != nil {
		t.Skipf("hipRTC not found (%v)", err)
	}
	// No --offload-arch: hipRTC compiles for the current device.
	out, err := rtc.Compile(kernels.HIP, "copy.hip", []string{"-O3"})
	if err != nil {
		t.Fatal(err)
	}
	mod, err := r.ModuleLoadData(out.Code)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.ModuleUnload(mod) }()
	fn, err := r.ModuleFunction(mod, kernels.ContigCopy)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1<<20 + 13 // an odd tail exercises the byte path
	src, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(src) }()
	dst, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(dst) }()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	if err := r.MemcpyHtoD(src, data); err != nil {
		t.Fatal(err)
	}
	args := new([3]uint64)
	args[0], args[1], args[2] = uint64(dst), uint64(src), n
	params := []unsafe.Pointer{unsafe.Pointer(&args[0]), unsafe.Pointer(&args[1]), unsafe.Pointer(&args[2])}
	if err := r.Launch(fn, LaunchConfig{GridX: 64, BlockX: 256}, params); err != nil {
		t.Fatal(err)
	}
	if err := r.DeviceSynchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := r.MemcpyDtoH(got, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("fx_copy_contig corrupted the data")
	}
}

func TestGPUVMMExportImport(t *testing.T) {
	r, dev := gpu(t)
	if !r.HasVMM() {
		t.Skipf("HIP %d has no usable VMM API", r.RuntimeVersion())
	}
	a, err := r.VMMAlloc(dev, 2<<20, HandleTypePosixFD)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.VMMFree(a) }()
	want := bytes.Repeat([]byte("fabricxfer"), 1000)
	if err := r.MemcpyHtoD(a.Ptr, want); err != nil {
		t.Fatal(err)
	}
	fd, err := r.ExportPosixFD(a.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.NewFile(uintptr(fd), "vmm").Close() }()
	h, err := r.ImportPosixFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.Granularity(dev, HandleTypePosixFD)
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.MapHandle(h, a.Size, g, []Device{dev})
	if err != nil {
		t.Fatal(errors.Join(err, r.MemRelease(h)))
	}
	got := make([]byte, len(want))
	if err := r.MemcpyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if err := r.UnmapRange(p, a.Size); err != nil {
		t.Fatal(err)
	}
	if err := r.MemRelease(h); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the imported mapping does not show the exported memory")
	}
}

// TestGPUIPCAcrossProcesses exports a hipMalloc allocation with an IPC handle
// and has a child process open it and read it back: an IPC handle cannot be
// opened by the process that made it.
func TestGPUIPCAcrossProcesses(t *testing.T) {
	if h := os.Getenv("FX_HIP_IPC_CHILD"); h != "" {
		ipcChild(t, h)
		return
	}
	r, _ := gpu(t)
	const n = 1 << 16
	p, err := r.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Free(p) }()
	if err := r.MemcpyHtoD(p, bytes.Repeat([]byte{0x5A}, n)); err != nil {
		t.Fatal(err)
	}
	h, err := r.IPCGetMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUIPCAcrossProcesses$", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), "FX_HIP_IPC_CHILD="+hex.EncodeToString(h[:]))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ipc child ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func ipcChild(t *testing.T, handle string) {
	r, _ := gpu(t)
	raw, err := hex.DecodeString(handle)
	if err != nil || len(raw) != 64 {
		t.Fatalf("bad handle %q: %v", handle, err)
	}
	var h IPCMemHandle
	copy(h[:], raw)
	p, err := r.IPCOpenMemHandle(h)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1<<16)
	if err := r.MemcpyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if err := r.IPCCloseMemHandle(p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5A}, 1<<16)) {
		t.Fatal("IPC mapping shows other bytes")
	}
	t.Log("ipc child ok")
	os.Stdout.WriteString("ipc child ok\n")
}
