// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// The cross-process tests exec this test binary as the exporting process (a
// fork that touches CUDA without exec is not supported by the driver).
const childEnv = "FXCOPY_EXPORT_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := exportChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "export child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const childSize = 64 << 20

func childPattern(seed uint64) []byte { return randomBytes(rand.New(rand.NewPCG(seed, 77)), childSize) }

// exportChild allocates memory, fills it with a known pattern, hands its
// handle to the parent over fd 3, then checks what the parent wrote.
func exportChild(mode string) error {
	runtime.LockOSThread()
	conn, err := net.FileConn(os.NewFile(3, "parent"))
	if err != nil {
		return err
	}
	uc := conn.(*net.UnixConn)
	drv, err := cuda.Load()
	if err != nil {
		return err
	}
	dev, err := drv.DeviceGet(0)
	if err != nil {
		return err
	}
	ctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		return err
	}
	if err := drv.CtxSetCurrent(ctx); err != nil {
		return err
	}
	var ptr cuda.DevicePtr
	var msg []byte
	var oob []byte
	switch mode {
	case "vmm":
		a, err := drv.VMMAlloc(dev, childSize, cuda.HandleTypePosixFD)
		if err != nil {
			return err
		}
		defer drv.VMMFree(a)
		ptr = a.Ptr
		fd, err := drv.ExportPosixFD(a.Handle)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		oob = syscall.UnixRights(fd)
		msg = []byte(fmt.Sprintf("vmm %d\n", a.Size))
	case "ipc":
		p, err := drv.MemAlloc(childSize)
		if err != nil {
			return err
		}
		defer drv.MemFree(p)
		ptr = p
		h, err := drv.IPCGetMemHandle(p)
		if err != nil {
			return err
		}
		msg = []byte(fmt.Sprintf("ipc %x\n", h[:]))
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	if err := drv.MemcpyHtoD(ptr, childPattern(1)); err != nil {
		return err
	}
	if _, _, err := uc.WriteMsgUnix(msg, oob, nil); err != nil {
		return err
	}
	rd := bufio.NewReader(uc)
	line, err := rd.ReadString('\n')
	if err != nil {
		return err
	}
	var off, n uint64
	var seed uint64
	if _, err := fmt.Sscanf(line, "check %d %d %d", &seed, &off, &n); err != nil {
		return fmt.Errorf("parsing %q: %w", line, err)
	}
	got := make([]byte, n)
	if err := drv.MemcpyDtoH(got, ptr+cuda.DevicePtr(off)); err != nil {
		return err
	}
	want := childPattern(seed)[:n]
	verdict := "ok"
	if !bytes.Equal(got, want) {
		verdict = "bad"
	}
	fmt.Fprintf(uc, "%s %08x\n", verdict, crc32.ChecksumIEEE(got))
	_, err = rd.ReadString('\n') // "bye": the parent has unmapped
	return err
}

func testCrossProcess(t *testing.T, mode string) {
	eng, _, drv, ctx := gpuEngine(t)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(fds[0]), "p"), os.NewFile(uintptr(fds[1]), "c")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.ExtraFiles = []*os.File{childEnd}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnd.Close()
	defer cmd.Wait()
	defer cmd.Process.Kill()
	conn, err := net.FileConn(parentEnd)
	if err != nil {
		t.Fatal(err)
	}
	uc := conn.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(60 * time.Second))
	buf, oob := make([]byte, 512), make([]byte, 128)
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(buf[:n]))
	desc := engines.MemoryDesc{ID: "node-a/child", Node: "node-a", Size: childSize,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}
	switch fields[0] {
	case "vmm":
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Fatalf("control message: %v", err)
		}
		rights, err := syscall.ParseUnixRights(&msgs[0])
		if err != nil || len(rights) != 1 {
			t.Fatalf("fd: %v", err)
		}
		var allocSize uint64
		fmt.Sscan(fields[1], &allocSize)
		f := os.NewFile(uintptr(rights[0]), "child-vmm")
		defer f.Close()
		desc.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, AllocSize: allocSize}
	case "ipc":
		var h []byte
		fmt.Sscanf(fields[1], "%x", &h)
		desc.Handles.IPC = h
	}
	if mode == "ipc" {
		// The handle names the child's 64 MiB allocation: a region one byte longer, or
		// at an offset past it, is refused by the driver's own account of its size.
		for _, bad := range []struct{ off, size uint64 }{{0, childSize + 1}, {childSize, 1}, {4096, 64 << 30}} {
			d := desc
			d.ID, d.Size = "node-a/child-past", bad.size
			d.Handles.IPCOffset = bad.off
			if _, err := eng.Register(context.Background(), d); err == nil || !strings.Contains(err.Error(), "runs past") {
				t.Fatalf("a region at offset %d of %d bytes in a %d-byte allocation: %v, want a refusal", bad.off, bad.size, childSize, err)
			}
		}
	}
	if _, err := eng.Register(context.Background(), desc); err != nil {
		t.Fatalf("registering the child's memory: %v", err)
	}
	var local cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { local, err = drv.MemAlloc(childSize); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(local) })
	if _, err := eng.Register(context.Background(), gpuDesc("node-a/local", local, childSize)); err != nil {
		t.Fatal(err)
	}

	// Read: scattered odd-sized blocks from the child's memory into ours.
	r := rand.New(rand.NewPCG(3, 3))
	var items []engines.Item
	const slot = 4096
	for i, s := range r.Perm(childSize / slot)[:8000] {
		sz := 1 + r.Uint64N(slot-1)
		items = append(items, engines.Item{Src: "node-a/child", SrcOffset: uint64(s)*slot + r.Uint64N(slot-sz+1),
			Dst: "node-a/local", DstOffset: uint64(i) * slot, Size: sz, Tag: engines.Tag(i)})
	}
	run(t, eng, items)
	got := make([]byte, childSize)
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(got, local) }); err != nil {
		t.Fatal(err)
	}
	pattern := childPattern(1)
	for _, it := range items {
		if !bytes.Equal(got[it.DstOffset:it.DstOffset+it.Size], pattern[it.SrcOffset:it.SrcOffset+it.Size]) {
			t.Fatalf("tag %d read from the child differs", it.Tag)
		}
	}
	// Write: a new pattern into the child's memory, which the child checks.
	const off, size = 4099, 30<<20 + 5
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyHtoD(local, childPattern(2)[:size]) }); err != nil {
		t.Fatal(err)
	}
	run(t, eng, []engines.Item{{Src: "node-a/local", Dst: "node-a/child", DstOffset: off, Size: size, Tag: 1}})
	// The child compares its [off, off+size) with the first size bytes of pattern 2.
	fmt.Fprintf(uc, "check %d %d %d\n", 2, off, size)
	reply, err := bufio.NewReader(uc).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: child saw: %s", mode, strings.TrimSpace(reply))
	if !strings.HasPrefix(reply, "ok") {
		t.Fatalf("child found wrong bytes: %s", reply)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Deregister(dctx, "node-a/child"); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(uc, "bye")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

func run(t *testing.T, eng engines.Engine, items []engines.Item) {
	t.Helper()
	b := eng.NewPlan()
	for _, it := range items {
		if err := b.Add(it); err != nil {
			t.Fatal(err)
		}
	}
	ps := b.Build()
	if len(ps.Rejected) > 0 {
		t.Fatalf("rejected: %v", ps.Rejected[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := eng.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestGPUImportsVMMFromAnotherProcess(t *testing.T) { testCrossProcess(t, "vmm") }
func TestGPUImportsIPCFromAnotherProcess(t *testing.T) { testCrossProcess(t, "ipc") }
