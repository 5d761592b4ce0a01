// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/client"
)

// envSocketClient selects the client mode of this test binary: it holds the agent socket's path, and
// TestSocketGroupClientProcess then acts as a pod's process under whatever uid and groups it was started with.
const envSocketClient = "FABRICXFER_TEST_SOCKET_CLIENT"

const (
	// socketGroup is the group the agent gives its directory and sockets; nobody on a test machine uses it.
	socketGroup = 4242
	// nobody is the unprivileged uid (and primary gid) the clients run as.
	nobody = 65534
)

// TestSocketGroupClientProcess is not a test of its own: started by TestSocketGroupAdmitsItsMembersOnly with
// envSocketClient set, it dials each socket, then (when they all connect) calls GetInfo and moves host
// memory through the agent, and prints one line per step for the parent to read.
func TestSocketGroupClientProcess(t *testing.T) {
	path := os.Getenv(envSocketClient)
	if path == "" {
		t.Skip("client process of TestSocketGroupAdmitsItsMembersOnly; runs only when that test starts it")
	}
	// The parent writes this process's cgroup fixture before it lets the client go: the agent identifies a
	// caller by pid when the connection is accepted.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Printf("FAIL waiting for the parent: %v\n", err)
		return
	}
	fmt.Printf("IDS uid=%d gid=%d\n", os.Getuid(), os.Getgid())
	refused := false
	for _, name := range []string{server.SocketName, server.FDSocketName, server.FastSocketName} {
		c, err := net.Dial("unix", filepath.Join(filepath.Dir(path), name))
		switch {
		case err == nil:
			c.Close()
			fmt.Printf("DIAL %s ok\n", name)
		case errors.Is(err, syscall.EACCES):
			refused = true
			fmt.Printf("DIAL %s EACCES\n", name)
		default:
			refused = true
			fmt.Printf("DIAL %s other: %v\n", name, err)
		}
	}
	if refused {
		// What a refused pod sees from the client: the kernel's refusal and what to change.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if c, err := client.Dial(ctx, path); err != nil {
			fmt.Printf("CLIENT refused: %v\n", err)
		} else {
			c.Close()
			fmt.Println("CLIENT connected")
		}
		return
	}
	if err := clientRoundTrip(path); err != nil {
		fmt.Printf("FAIL %v\n", err)
		return
	}
	fmt.Println("TRANSFER ok")
}

// clientRoundTrip is what a pod does: GetInfo, register two host buffers (agent.fd.sock) and copy one into
// the other (agent.fast.sock for a waited call).
func clientRoundTrip(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, path)
	if err != nil {
		return fmt.Errorf("dialing the agent: %w", err)
	}
	defer c.Close()
	info := c.Info()
	fmt.Printf("INFO pool=%s caller=%s\n", info.PoolName, info.Caller.Identity)
	const size = 64 << 10
	src, err := client.NewSharedMemory("src", size)
	if err != nil {
		return fmt.Errorf("creating the source buffer: %w", err)
	}
	defer src.Close()
	dst, err := client.NewSharedMemory("dst", size)
	if err != nil {
		return fmt.Errorf("creating the destination buffer: %w", err)
	}
	defer dst.Close()
	for i := range src.Bytes {
		src.Bytes[i] = byte(i*7 + 3)
	}
	rs, err := c.RegisterHost(ctx, src.File, 0, size)
	if err != nil {
		return fmt.Errorf("registering the source: %w", err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, size)
	if err != nil {
		return fmt.Errorf("registering the destination: %w", err)
	}
	items := []client.Item{{Local: rs, Remote: client.ToRegion(rd), Length: size}}
	if _, err := c.Do(ctx, client.Write, items, client.TransferOptions{}); err != nil {
		return fmt.Errorf("copying: %w", err)
	}
	if sha256.Sum256(src.Bytes) != sha256.Sum256(dst.Bytes) {
		return errors.New("the destination differs from the source after the copy")
	}
	return nil
}

// TestSocketGroupAdmitsItsMembersOnly starts an agent with a socket group and runs real client processes
// under an unprivileged uid: one with the group among its supplementary groups (a pod with
// securityContext.supplementalGroups) connects to all three sockets and moves bytes; one without it is refused
// by the kernel with EACCES before the agent sees anything.
func TestSocketGroupAdmitsItsMembersOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client under another uid")
	}
	// t.TempDir's parents are 0700: a directory of our own, traversable by everyone, holds a copy of this test
	// binary (the build directory is private too) and the agent's socket directory.
	base, err := os.MkdirTemp("", "fx-socketgroup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := copyTestBinary(t, base)
	socketDir := filepath.Join(base, "sockets")
	if err := os.Mkdir(socketDir, 0o755); err != nil {
		t.Fatal(err)
	}

	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.SocketDir = socketDir
	opts.SocketGID = socketGroup
	a := startAgent(t, opts)

	// What the kernel checks: the directory is the group's and closed to others, every socket the group's 0660.
	dir := filepath.Dir(a.srv.SocketPath())
	checkOwnership(t, dir, socketGroup, os.ModeDir|0o750)
	for _, p := range []string{a.srv.SocketPath(), a.srv.FDSocketPath(), a.srv.FastSocketPath()} {
		checkOwnership(t, p, socketGroup, os.ModeSocket|0o660)
	}

	t.Run("member", func(t *testing.T) {
		out := runClient(t, proc, bin, a.srv.SocketPath(), &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{socketGroup}})
		if missing := missingLines(out, "IDS uid=65534 gid=65534",
			"DIAL agent.sock ok", "DIAL agent.fd.sock ok", "DIAL agent.fast.sock ok",
			"INFO pool=kv caller=local/uid=65534", "TRANSFER ok"); len(missing) > 0 {
			t.Errorf("client in the socket group: no %q in its output:\n%s", missing, out)
		}
	})
	t.Run("not a member", func(t *testing.T) {
		out := runClient(t, proc, bin, a.srv.SocketPath(), &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}})
		if missing := missingLines(out, "IDS uid=65534 gid=65534",
			"DIAL agent.sock EACCES", "DIAL agent.fd.sock EACCES", "DIAL agent.fast.sock EACCES"); len(missing) > 0 {
			t.Errorf("client outside the socket group: no %q in its output:\n%s", missing, out)
		}
		if strings.Contains(out, "TRANSFER") || strings.Contains(out, "INFO") || strings.Contains(out, "CLIENT connected") {
			t.Errorf("client outside the socket group reached the agent:\n%s", out)
		}
		if !strings.Contains(out, "CLIENT refused: connecting to agent socket "+a.srv.SocketPath()+" as uid 65534") ||
			!strings.Contains(out, "permission denied") || !strings.Contains(out, "spec.socketGroup in its securityContext.supplementalGroups") {
			t.Errorf("the client's refusal does not say what to change:\n%s", out)
		}
	})
}

// TestSocketDirectoryFollowsTheGroupAcrossRestarts restarts an agent on the same directory with the group, then
// without it: each start sets the directory's group and mode again, so removing the group closes the door.
func TestSocketDirectoryFollowsTheGroupAcrossRestarts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the socket directory to another group")
	}
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.SocketGID = socketGroup
	a := startAgent(t, opts)
	dir := filepath.Dir(a.srv.SocketPath())
	checkOwnership(t, dir, socketGroup, os.ModeDir|0o750)
	a.stop(t)

	opts.SocketGID = -1
	a = startAgent(t, opts)
	checkOwnership(t, dir, os.Getegid(), os.ModeDir|0o755)
	checkOwnership(t, a.srv.FastSocketPath(), os.Getegid(), os.ModeSocket|0o660)
}

// missingLines returns the lines of want that out does not have.
func missingLines(out string, want ...string) []string {
	have := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		have[l] = true
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

func checkOwnership(t *testing.T, path string, gid int, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("%s: no stat_t", path)
	}
	if int(st.Gid) != gid || fi.Mode()&(os.ModeType|os.ModePerm) != mode {
		t.Errorf("%s: group %d, mode %v; want group %d, mode %v", path, st.Gid, fi.Mode(), gid, mode)
	}
}

// copyTestBinary copies this test binary to dir/client.test, readable and executable by everyone.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	path := filepath.Join(dir, "client.test")
	out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// runClient runs TestSocketGroupClientProcess under cred and returns what it printed. The caller's cgroup
// fixture is written for the child's pid before the child is let go.
func runClient(t *testing.T, proc *procFixture, bin, socketPath string, cred *syscall.Credential) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestSocketGroupClientProcess$", "-test.count=1")
	cmd.Dir = "/"
	cmd.Env = []string{envSocketClient + "=" + socketPath, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the client as uid %d: %v", cred.Uid, err)
	}
	proc.writeFor(t, cmd.Process.Pid, "0::/user.slice/user-65534.slice/session-2.scope\n")
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Errorf("letting the client go: %v", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client as uid %d: %v\n%s", cred.Uid, err, out.String())
	}
	return out.String()
}

func (p *procFixture) writeFor(t *testing.T, pid int, content string) {
	t.Helper()
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
