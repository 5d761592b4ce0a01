// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const connectHelperEnv = "FABRICXFER_IDENTITY_CONNECT_TO"

// TestHelperConnectsAndExits is the child of TestIdentifyConnRefusesAPeerThatExited: it connects, says so and
// exits. Run directly (without the variable) it does nothing.
func TestHelperConnectsAndExits(t *testing.T) {
	path := os.Getenv(connectHelperEnv)
	if path == "" {
		return
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Exit(2)
	}
	_, _ = c.Write([]byte{1})
	os.Exit(0)
}

// A process connects and exits; its pid is then taken by a pod's process (here: a fixture /proc whose entry
// for that pid names a pod). Identified by pid alone, the connection would be that pod's.
func TestIdentifyConnRefusesAPeerThatExited(t *testing.T) {
	if !kernelHasPeerPIDFD(t) {
		t.Skip("this kernel gives no pidfd for a socket's peer (SO_PEERPIDFD, Linux 6.5): identification cannot tell an exited peer from a live one")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperConnectsAndExits$")
	child.Env = append(os.Environ(), connectHelperEnv+"="+sock)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	_ = ln.SetDeadline(time.Now().Add(20 * time.Second))
	conn, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil { // reaped: its pid is free for another process
		t.Fatalf("the connecting child: %v", err)
	}

	procRoot := filepath.Join(dir, "proc")
	inPod := func(pid int) { // the fixture /proc says pid is a process of pod 11111111-…
		t.Helper()
		p := filepath.Join(procRoot, strconv.Itoa(pid))
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "cgroup"),
			[]byte("0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/x.scope\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inPod(child.Process.Pid)
	id := Identifier{ProcRoot: procRoot, Pods: podLookup(func(string) (PodRef, error) {
		return PodRef{Namespace: "infer", Name: "vllm-0"}, nil
	})}
	if c, err := id.IdentifyConn(ctx, conn); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("a peer that exited, its pid now a pod's: %+v, %v; want ErrPeerGone", c, err)
	}
	// Nor is the connection counted against that pod's limits.
	cred, err := PeerCredOf(conn)
	if err != nil {
		t.Fatal(err)
	}
	if h := id.HolderOf(conn, cred); h != "unreadable" {
		t.Fatalf("holder of a peer that exited, its pid now a pod's: %q, want unreadable", h)
	}

	// A live peer (this process, connected to itself) with the same fixture entry at its pid is identified.
	own, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	live, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	inPod(os.Getpid())
	if c, err := id.IdentifyConn(ctx, live); err != nil || c.PodName != "vllm-0" {
		t.Fatalf("a live peer: %+v, %v", c, err)
	}
	if cred, err = PeerCredOf(live); err != nil {
		t.Fatal(err)
	}
	if h := id.HolderOf(live, cred); h != "pod/11111111-2222-3333-4444-555555555555" {
		t.Fatalf("holder of a live peer: %q", h)
	}
}

// kernelHasPeerPIDFD asks the kernel for the pidfd of a socket pair's peer (this process).
func kernelHasPeerPIDFD(t *testing.T) bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return false
	}
	unix.Close(pidfd)
	return true
}
