// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// procFixture is a proc root whose cgroup file for this test process says which pod (if any) it is in. All
// connections of a test come from this one process, so a test that needs two callers rewrites the file
// between dials: identification happens when a connection is accepted.
type procFixture struct{ root string }

func newProcFixture(t *testing.T) *procFixture {
	t.Helper()
	p := &procFixture{root: t.TempDir()}
	p.setLocal(t)
	return p
}

func (p *procFixture) write(t *testing.T, content string) {
	t.Helper()
	dir := filepath.Join(p.root, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (p *procFixture) setLocal(t *testing.T) {
	p.write(t, "0::/user.slice/user-0.slice/session-1.scope\n")
}

// setPod writes a cgroup v2 path as the systemd cgroup driver of the kubelet makes it.
func (p *procFixture) setPod(t *testing.T, uid string) {
	under := []byte(uid)
	for i, c := range under {
		if c == '-' {
			under[i] = '_'
		}
	}
	p.write(t, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+string(under)+
		".slice/cri-containerd-0123456789abcdef.scope\n")
}

// podOptions are baseOptions whose callers are pods named by their UIDs (setPod picks the next connection's), for
// tests of several callers.
func podOptions(t *testing.T) (server.Options, *procFixture) {
	t.Helper()
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: podsByUID{}}
	return opts, proc
}

type agent struct {
	srv    *server.Server
	opts   server.Options
	cancel context.CancelFunc
	done   chan error
}

func hostComposite(t *testing.T, node string, more ...engines.Engine) *engines.Composite {
	t.Helper()
	x, err := xgmi.New(xgmi.Options{Node: node}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	c, err := engines.NewComposite(engines.CompositeOptions{Node: node}, append([]engines.Engine{x}, more...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeComposite is a host composite assembled as the agent assembles its node's (agent/node): one region
// registry shared by the composite and its engines, and the engines' metrics.
func nodeComposite(t *testing.T, node string) *engines.Composite {
	t.Helper()
	regions := engines.NewRegistry(node, 0)
	x, err := xgmi.New(xgmi.Options{Node: node, Registry: regions}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	c, err := engines.NewComposite(engines.CompositeOptions{Node: node, Metrics: engines.NewMetrics(), Registry: regions}, x)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// baseOptions is a local-only agent (callers outside pods admitted) on a fresh socket directory.
func baseOptions(t *testing.T, proc *procFixture) server.Options {
	return server.Options{
		SocketDir: t.TempDir(), PoolNamespace: "infer", PoolName: "kv", NodeName: "node-a", AgentVersion: "test",
		Engine:     hostComposite(t, "node-a"),
		Engines:    []server.EngineStatus{{Name: "xgmi", Available: true, Reason: "host backend"}},
		Identifier: identity.Identifier{ProcRoot: proc.root, AllowLocal: true},
		SocketGID:  -1, SessionGrace: 5 * time.Second,
	}
}

func startAgent(t *testing.T, opts server.Options) *agent {
	t.Helper()
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{srv: srv, opts: opts, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- srv.Serve(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(srv.FDSocketPath()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent socket %s did not appear", srv.SocketPath())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent stopped with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop within 15 s")
	}
}

func dial(t *testing.T, a *agent, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.srv.SocketPath(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func shm(t *testing.T, size uint64) *client.SharedMemory {
	t.Helper()
	m, err := client.NewSharedMemory("test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newHostPool(t *testing.T, size uint64) *poolmem.HostPool {
	p, err := poolmem.NewHost("test-pool", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func hostCompositeWithMetrics(t *testing.T, node string, m *engines.Metrics) *engines.Composite {
	t.Helper()
	x, err := xgmi.New(xgmi.Options{Node: node}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	c, err := engines.NewComposite(engines.CompositeOptions{Node: node, Metrics: m}, x)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
