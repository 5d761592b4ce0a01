// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

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
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
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
	return runAgentWith(dir, nil)
}

// runAgentWith is runAgentIn with tune (when set) changing the server's options.
func runAgentWith(dir string, tune func(*server.Options)) (srv *server.Server, stop func(), err error) {
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
	opts := server.Options{SocketDir: dir, PoolNamespace: "infer", PoolName: "kv", NodeName: "node-a",
		AgentVersion: "test", Engine: comp, Pool: pool, SocketGID: -1,
		Identifier: identity.Identifier{ProcRoot: "/proc", AllowLocal: true}}
	if tune != nil {
		tune(&opts)
	}
	srv, err = server.New(opts)
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

// TestPythonClient runs the Python client's tests (every client/python/tests/test_*.py; test_recover skips
// itself, TestPythonClientRecoversAfterAgentRestart runs it) with Debian's python3-grpcio against a real agent
// socket. The block-layout tests need python3-numpy and skip without it.
func TestPythonClient(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skip("python3-grpcio and python3-protobuf not installed: apt-get install python3-grpcio python3-protobuf")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
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
// SessionLost (a waited call the agent's stopping cut short included), recover() re-registers its regions once
// however many threads call it, and transfers work again.
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
		if _, stop, err = runAgentIn(dir); err != nil {
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
	if restarts != 4 { // once with the fast path, once without, once under a waited call, once for a partial recovery
		t.Fatalf("the agent was restarted %d times, want 4 (did the tests run?)", restarts)
	}
}

// TestPythonPackageInstalls installs client/python with pip into a fresh virtual environment (offline: the
// system's grpcio and protobuf through --system-site-packages, no index) and imports it from outside the source
// tree. The package is copied first so the build leaves nothing in the checkout.
func TestPythonPackageInstalls(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skip("python3-grpcio and python3-protobuf not installed: apt-get install python3-grpcio python3-protobuf")
	}
	tmp := t.TempDir()
	venv := filepath.Join(tmp, "venv")
	if out, err := exec.Command(python, "-m", "venv", "--system-site-packages", venv).CombinedOutput(); err != nil {
		t.Skipf("python3 -m venv is unavailable (apt-get install python3-venv python3-pip python3-setuptools python3-wheel): %v\n%s", err, out)
	}
	src := filepath.Join(tmp, "src")
	if err := copyTree(filepath.Join(".", "python"), src); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pip := exec.CommandContext(ctx, filepath.Join(venv, "bin", "pip"), "install", "--no-deps", "--no-build-isolation",
		"--no-index", src)
	pip.Dir = tmp
	pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_CACHE_DIR=1", "PYTHONDONTWRITEBYTECODE=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./client/python: %v\n%s", err, out)
	}
	want, err := pyprojectVersion(filepath.Join(".", "python", "pyproject.toml"))
	if err != nil {
		t.Fatal(err)
	}
	check := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-c", `
import os, sys, fabricxfer
from fabricxfer.agent.v1 import agent_pb2, agent_pb2_grpc
from fabricxfer.client import Client
assert fabricxfer.Client is Client
print(fabricxfer.__version__, os.path.dirname(fabricxfer.__file__), sys.prefix)
`)
	check.Dir = t.TempDir()
	check.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=")
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("importing the installed package: %v\n%s", err, out)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 3 {
		t.Fatalf("unexpected output %q", out)
	}
	if fields[0] != want {
		t.Errorf("installed fabricxfer %s, pyproject.toml says %s", fields[0], want)
	}
	if !strings.HasPrefix(fields[1], fields[2]+string(filepath.Separator)) {
		t.Errorf("fabricxfer imported from %s, not from the virtual environment %s", fields[1], fields[2])
	}
	t.Logf("installed fabricxfer %s into %s", fields[0], fields[1])
}

// pyprojectVersion reads [project] version from a pyproject.toml (and checks __init__.py says the same).
func pyprojectVersion(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "version" {
			version := strings.Trim(strings.TrimSpace(v), `"`)
			init, err := os.ReadFile(filepath.Join(filepath.Dir(path), "fabricxfer", "__init__.py"))
			if err != nil {
				return "", err
			}
			if !strings.Contains(string(init), fmt.Sprintf("__version__ = %q", version)) {
				return "", fmt.Errorf("fabricxfer/__init__.py does not say __version__ = %q like pyproject.toml", version)
			}
			return version, nil
		}
	}
	return "", fmt.Errorf("%s has no version", path)
}

// copyTree copies the regular files under src (skipping build outputs and caches) to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if name == "__pycache__" || name == "build" || name == "dist" || strings.HasSuffix(name, ".egg-info") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
}
