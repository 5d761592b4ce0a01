// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/node"
	fxclient "github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/syncbuf"
)

// TestStandaloneServesBlockTransfers runs "agent standalone" with no API server and a fixture root, and moves
// blocks between two host layouts of a local process through its socket.
func TestStandaloneServesBlockTransfers(t *testing.T) {
	socketDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	var stderr syncbuf.Buffer
	go func() {
		exit <- runMain(ctx, []string{"standalone", "--host-root", filepath.Join(testdata, "rdma-only-node"),
			"--node-name", "bench-0", "--socket-dir", socketDir, "--caller-host-root", "/"}, &bytes.Buffer{}, &stderr)
	}()
	defer func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("agent standalone exited %d: %s", code, stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Error("agent standalone did not stop within 15 s")
		}
	}()
	sock := filepath.Join(socketDir, "kv", "agent.sock")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(socketDir, "kv", "agent.fd.sock")); err == nil {
			break
		}
		select {
		case code := <-exit:
			t.Fatalf("agent standalone exited %d before serving: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket after 20 s: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c, err := fxclient.Dial(cctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Info().NodeName; got != "bench-0" {
		t.Fatalf("node name %q, want bench-0", got)
	}
	const bs, blocks = 256, 8
	layout := func(fill byte) (*fxclient.Layout, *fxclient.SharedMemory) {
		m, err := fxclient.NewSharedMemory("standalone", bs*blocks)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		for i := range m.Bytes {
			m.Bytes[i] = fill + byte(i/bs)
		}
		r, err := c.RegisterHost(cctx, m.File, 0, m.Size())
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.RegisterLayout(cctx, []*fxclient.Region{r}, bs)
		if err != nil {
			t.Fatal(err)
		}
		return l, m
	}
	src, srcMem := layout(0x10)
	dst, dstMem := layout(0x80)
	if _, err := c.TransferBlocks(cctx, fxclient.Write, src, []uint32{7, 1}, fxclient.ToLayout(dst), []uint32{0, 5}, fxclient.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0}, bs*blocks)
	for i := range want {
		want[i] = 0x80 + byte(i/bs)
	}
	copy(want[0:bs], srcMem.Bytes[7*bs:8*bs])
	copy(want[5*bs:6*bs], srcMem.Bytes[1*bs:2*bs])
	if !bytes.Equal(dstMem.Bytes, want) {
		t.Fatal("destination differs from blocks 7 and 1 written to 0 and 5")
	}
	// The agent runs in this process: while it serves, the collector's goal stays above twice its heap floor.
	runtime.GC()
	goal := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(goal)
	if g := goal[0].Value.Uint64(); g < 2*node.DefaultGCHeapFloor {
		t.Fatalf("heap goal %d bytes while the agent serves, want at least twice its default floor of %d", g, node.DefaultGCHeapFloor)
	}
}

// A heap floor above 4 GiB (bytes typed for kilobytes, say) is refused before anything starts.
func TestStandaloneRefusesAHugeHeapFloor(t *testing.T) {
	var stderr bytes.Buffer
	code := runMain(context.Background(), []string{"standalone", "--host-root", filepath.Join(testdata, "rdma-only-node"),
		"--node-name", "bench-0", "--socket-dir", t.TempDir(), "--gc-heap-floor", "5368709120"}, &bytes.Buffer{}, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--gc-heap-floor 5368709120 bytes is above") {
		t.Fatalf("exit %d, stderr %q: want 1 and the floor refused", code, stderr.String())
	}
}

// TestStandaloneRefusesClusterFlags: flags only an agent in a cluster reads are refused by name before anything
// starts (--report-only served a socket all the same, --kubeconfig and --dra were ignored), -h lists the others
// and exits 0, and a pool name that would put the socket elsewhere is refused.
func TestStandaloneRefusesClusterFlags(t *testing.T) {
	base := []string{"standalone", "--host-root", filepath.Join(testdata, "rdma-only-node"), "--node-name", "bench-0", "--socket-dir", t.TempDir()}
	for _, extra := range [][]string{{"--report-only"}, {"--kubeconfig", "/nonexistent"}, {"--dra"}, {"--node-cert"}, {"--cdi-dir", "/tmp"}} {
		var stderr bytes.Buffer
		code := runMain(context.Background(), append(append([]string{}, base...), extra...), &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), extra[0]+": only an agent in a cluster") {
			t.Errorf("standalone %v: exit %d, stderr %q; want 2 and the flag named", extra, code, stderr.String())
		}
	}
	var stderr bytes.Buffer
	if code := runMain(context.Background(), []string{"standalone", "-h"}, &bytes.Buffer{}, &stderr); code != 0 {
		t.Errorf("standalone -h: exit %d", code)
	}
	for _, name := range []string{"-socket-dir", "-pool-name", "-peers", "-cpu-profile"} {
		if !strings.Contains(stderr.String(), "  "+name+" ") {
			t.Errorf("standalone -h does not list %s:\n%s", name, stderr.String())
		}
	}
	for _, name := range []string{"-kubeconfig", "-report-only", "-dra ", "-node-cert", "-kubelet-plugin-dir"} {
		if strings.Contains(stderr.String(), "  "+name) {
			t.Errorf("standalone -h lists %s, which standalone refuses", name)
		}
	}
	for _, pool := range []string{"x/y", "..", "Big"} {
		var stderr bytes.Buffer
		code := runMain(context.Background(), append(append([]string{}, base...), "--pool-name", pool), &bytes.Buffer{}, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "is no TransferPool name") {
			t.Errorf("standalone --pool-name %q: exit %d, stderr %q; want 1 and the name refused", pool, code, stderr.String())
		}
	}
	var nsErr bytes.Buffer
	code := runMain(context.Background(), append(append([]string{}, base...), "--pool-namespace", "a/b"), &bytes.Buffer{}, &nsErr)
	if code != 1 || !strings.Contains(nsErr.String(), "is no namespace") {
		t.Errorf("standalone --pool-namespace a/b: exit %d, stderr %q; want 1 and the namespace refused", code, nsErr.String())
	}
}
