package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// runLocalAgent runs an agent server on a temporary socket directory, identifying callers through the real
// /proc (callers outside any pod are admitted as local, as in the demo). The example and the Python tests share
// it.
func runLocalAgent() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "fxsock")
	if err != nil {
		return nil, nil, err
	}
	srv, stopAgent, err := runAgentIn(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return srv, func() { stopAgent(); os.RemoveAll(dir) }, nil
}

// runAgentIn runs an agent server with its sockets in dir; stop ends it and leaves dir.
func runAgentIn(dir string) (srv *server.Server, stop func(), err error) {
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		return nil, nil, err
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x)
	if err != nil {
		return nil, nil, err
	}
	pool, err := poolmem.NewHost("pool", 4<<20)
	if err != nil {
		return nil, nil, err
	}
	srv, err = server.New(server.Options{SocketDir: dir, PoolNamespace: "infer", PoolName: "kv", NodeName: "node-a",
		AgentVersion: "test", Engine: comp, Pool: pool, SocketGID: -1,
		Identifier: server.Identifier{ProcRoot: "/proc", AllowLocal: true}})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
		}
		comp.Close()
		pool.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(srv.FDSocketPath()); err == nil {
			return srv, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("agent socket %s did not appear", srv.SocketPath())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPythonClient runs the Python client's tests (client/python/tests) with Debian's python3-grpcio against
// a real agent socket.
func TestPythonClient(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skip("python3-grpcio and python3-protobuf not installed: apt-get install python3-grpcio python3-protobuf")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "-v", "tests.test_client")
	cmd.Dir = filepath.Join(".", "python")
	cmd.Env = append(os.Environ(), "FABRICXFER_SOCKET="+exampleSocket, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python tests:\n%s", out)
	if err != nil {
		t.Fatalf("python client tests failed: %v", err)
	}
}

// TestPythonClientRecoversAfterAgentRestart restarts the agent under a running Python client (at the moment the
// client asks for it on stdout) and lets client/python/tests/test_recover.py check that calls fail with
// SessionLost, recover() re-registers its regions and transfers work again.
func TestPythonClientRecoversAfterAgentRestart(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skip("python3-grpcio and python3-protobuf not installed: apt-get install python3-grpcio python3-protobuf")
	}
	dir := t.TempDir()
	srv, stop, err := runAgentIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "-v", "tests.test_recover")
	cmd.Dir = filepath.Join(".", "python")
	cmd.Env = append(os.Environ(), "FABRICXFER_SOCKET="+srv.SocketPath(), "FABRICXFER_RESTARTS=1", "PYTHONDONTWRITEBYTECODE=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	restarts := 0
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		t.Logf("python: %s", lines.Text())
		if lines.Text() != "RESTART-AGENT" {
			continue
		}
		stop()
		if srv, stop, err = runAgentIn(dir); err != nil {
			t.Fatalf("restarting the agent: %v", err)
		}
		restarts++
		if _, err := io.WriteString(stdin, "restarted\n"); err != nil {
			t.Fatalf("telling the client: %v", err)
		}
	}
	err = cmd.Wait()
	t.Logf("python tests:\n%s", stderr.String())
	if err != nil {
		t.Fatalf("python recover test failed: %v", err)
	}
	if restarts != 2 { // once with the fast path, once without
		t.Fatalf("the agent was restarted %d times, want 2 (did the test run?)", restarts)
	}
}
