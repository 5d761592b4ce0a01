// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

const (
	peerProcessEnv = "FABRICXFER_TCP_TEST_PEER"
	killRegion     = 1 << 30
)

// mapRegion maps size bytes of anonymous memory without reserving it: untouched pages read as zero and cost
// no RAM, so a 1 GiB transfer's source is free and only bytes that land take memory.
func mapRegion(t testing.TB, size int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", size, err)
	}
	return b
}

// TestPeerProcess is the peer side of TestPeerKilledMidTransfer, run in a child process.
func TestPeerProcess(t *testing.T) {
	if os.Getenv(peerProcessEnv) == "" {
		t.Skip("runs only as the child process of TestPeerKilledMidTransfer")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	// "staged": the region is GPU memory staged through a fake stager over host memory.
	staged := os.Getenv(peerProcessEnv) == "staged"
	var s *fakeStager
	if staged {
		s = newFakeStager(t)
	}
	opts := Options{Node: "node-b", Listener: ln, Logf: func(string, ...any) {}}
	if staged {
		opts.Stager = s
	}
	e, err := New(opts)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	var d engines.MemoryDesc
	if staged {
		d = registerGPU(t, e, s, "node-b/kv", mapRegion(t, killRegion))
	} else {
		d = register(t, e, "node-b/kv", mapRegion(t, killRegion))
	}
	b, err := engines.MarshalDesc(d)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(base64.StdEncoding.EncodeToString(b))
	// Serve until the parent closes stdin (or kills this process); never longer than a minute.
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
	}
	os.Exit(0)
}

// TestPeerKilledMidTransfer kills the peer process while four transfers (two reads, two writes, 1 GiB in all)
// are in flight: each must fail within 2 s with an error naming the peer. Staged, both regions are GPU memory
// (fake stagers over host memory), and the local one stays registered.
func TestPeerKilledMidTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process and moves up to 1 GiB")
	}
	for _, mode := range []string{"host", "staged"} {
		t.Run(mode, func(t *testing.T) { peerKilledMidTransfer(t, mode) })
	}
}

func peerKilledMidTransfer(t *testing.T, mode string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerProcess$")
	cmd.Env = append(os.Environ(), peerProcessEnv+"="+mode)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout)
	}()
	var encoded string
	select {
	case encoded = <-line:
	case <-time.After(30 * time.Second):
		t.Fatal("peer process did not report its region within 30 s")
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		t.Fatalf("peer process said %q: %v", encoded, err)
	}
	remote, err := engines.UnmarshalDesc(raw)
	if err != nil {
		t.Fatal(err)
	}

	var a *Engine
	var local engines.MemoryDesc
	localMem := mapRegion(t, killRegion)
	if mode == "staged" {
		s := newFakeStager(t)
		a = stagedEngine(t, "node-a", false, s, func(o *Options) { o.ChunkBytes = 4 << 20 })
		local = registerGPU(t, a, s, "node-a/kv", localMem)
	} else {
		a = newEngine(t, "node-a", nil)
		a.opts.ChunkBytes = 4 << 20
		local = register(t, a, "node-a/kv", localMem)
	}
	if err := a.Import(context.Background(), remote); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); syscall.Munmap(localMem) })

	const quarter = killRegion / 4
	items := []engines.Item{
		{Src: remote.ID, Dst: local.ID, SrcOffset: 0, DstOffset: 0, Size: quarter, Tag: 1},
		{Src: remote.ID, Dst: local.ID, SrcOffset: quarter, DstOffset: quarter, Size: quarter, Tag: 2},
		{Src: local.ID, Dst: remote.ID, SrcOffset: 2 * quarter, DstOffset: 2 * quarter, Size: quarter, Tag: 3},
		{Src: local.ID, Dst: remote.ID, SrcOffset: 3 * quarter, DstOffset: 3 * quarter, Size: quarter, Tag: 4},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var transfers []engines.Transfer
	for _, it := range items {
		b := a.NewPlan()
		if err := b.Add(it); err != nil {
			t.Fatal(err)
		}
		tr, err := a.Submit(ctx, b.Build(), engines.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		transfers = append(transfers, tr)
	}
	// Kill as soon as the first chunk has moved.
	for deadline := time.Now().Add(10 * time.Second); ; {
		s := a.Stats()
		if s.Received+s.Sent >= 4<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfers made no progress in 10 s: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	for i, tr := range transfers {
		select {
		case <-tr.Done():
			t.Fatalf("transfer %d finished before the kill; it was not in flight", i)
		default:
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	moved := a.Stats()
	for i, tr := range transfers {
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := tr.Wait(wctx)
		wcancel()
		took := time.Since(killed)
		var pl *engines.PeerLostError
		if !errors.As(err, &pl) || !errors.Is(err, engines.ErrPeerLost) || !strings.Contains(pl.Peer, "node-b") {
			t.Fatalf("transfer %d ended with %v, want a PeerLostError naming node-b", i, err)
		}
		if took > 2*time.Second {
			t.Fatalf("transfer %d failed %v after the kill, want within 2 s", i, took)
		}
		t.Logf("transfer %d failed %v after the kill: %v", i, took.Round(time.Millisecond), err)
	}
	t.Logf("moved before the kill: %d MiB read, %d MiB written", moved.Received>>20, moved.Sent>>20)
	if _, _, err := a.reg.Lookup(local.ID); err != nil {
		t.Fatalf("the local region is gone after the peer was killed: %v", err)
	}
}
