// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	fxclient "github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/syncbuf"
)

// TestAMDNodeWithoutHIPRunsHostBackendOnly runs the transfer side on the MI300X fixture with a HIP runtime that
// does not load: the same-node engine runs with the host backend only, and both the log and GetInfo say why.
func TestAMDNodeWithoutHIPRunsHostBackendOnly(t *testing.T) {
	socketDir := t.TempDir()
	missing := filepath.Join(t.TempDir(), "libamdhip64.so")
	fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var opts Options
	opts.RegisterFlags(fs)
	if err := fs.Parse([]string{"--host-root", filepath.Join(testdata, "mi300x-8gpu-roce"), "--node-name", "mi300x-1",
		"--pool-namespace", "inference", "--pool-name", "kv", "--socket-dir", socketDir, "--allow-local",
		"--caller-host-root", "/", "--health-addr", "", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
		"--tls-dir", "", "--libamdhip64", missing}); err != nil {
		t.Fatal(err)
	}
	detect, err := opts.Detection.detector(nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	log := funcr.New(func(prefix, args string) { logs.Write([]byte(prefix + " " + args + "\n")) }, funcr.Options{})
	ts, err := newTransferSideFromDetection(context.Background(), opts, nil, detect, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ts.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("transfer side stopped with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("transfer side did not stop within 10 s")
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); !ts.ready.Load(); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("transfer side stopped before serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("transfer side not ready within 10 s")
		}
	}
	if n := len(ts.xgmiBackends); n != 0 {
		t.Errorf("%d GPU backends for the same-node engine, want none (host backend only)", n)
	}
	if l := logs.String(); !strings.Contains(l, "AMD GPU copy backend unavailable: same-node copies use the host backend only") ||
		!strings.Contains(l, "HIP unavailable: "+missing) {
		t.Errorf("log does not say why the AMD backend is missing:\n%s", l)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, err := fxclient.Dial(dctx, filepath.Join(socketDir, "kv", "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	found := false
	for _, e := range c.Info().Engines {
		switch e.Name {
		case "xgmi":
			found = true
			want := "hardware: 8 GPUs, 28 XGMI peer pairs; same-GPU copies always; host backend only: HIP unavailable: " + missing
			if !e.Available || !strings.HasPrefix(e.Reason, want) {
				t.Errorf("xgmi engine: available %t, reason %q; want available, starting %q", e.Available, e.Reason, want)
			}
		case "fabric":
			if e.Available {
				t.Errorf("fabric engine reported available on an AMD node without a HIP fabric runtime: %q", e.Reason)
			}
		}
	}
	if !found {
		t.Fatalf("GetInfo lists no xgmi engine: %v", c.Info().Engines)
	}
}
