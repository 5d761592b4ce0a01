// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	fxclient "github.com/fabricxfer/fabricxfer/client"
)

// TestRDMAReportedUnavailableWithTheReason runs the transfer side on a fixture node with two usable RDMA ports
// and asks its socket, as a pod does, which engines run: where libibverbs does not load (or the pool's
// certificates are missing) GetInfo says rdma is unavailable, with what the hardware offers and why the engine
// does not run.
func TestRDMAReportedUnavailableWithTheReason(t *testing.T) {
	tlsDir := poolCertDir(t, "inference", "kv")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no libibverbs", []string{"--tls-dir", tlsDir, "--libibverbs", filepath.Join(t.TempDir(), "libibverbs.so.1")},
			"hardware: 2 of 2 ports usable; not running: libibverbs did not load: no RDMA verbs library"},
		{"no certificates", []string{"--tls-dir", ""},
			"hardware: 2 of 2 ports usable; not running: needs the pool's agent certificates (--tls-dir)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socketDir := t.TempDir()
			fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var opts Options
			opts.RegisterFlags(fs)
			args := append([]string{"--host-root", filepath.Join(testdata, "rdma-only-node"), "--node-name", "rdma-1",
				"--pool-namespace", "inference", "--pool-name", "kv", "--socket-dir", socketDir, "--allow-local",
				"--caller-host-root", "/", "--health-addr", "", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"},
				tc.args...)
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			detect, err := opts.Detection.detector(nil)
			if err != nil {
				t.Fatal(err)
			}
			// No API server: the transfer side reads no pods or TransferNodes with --allow-local and no peers.
			ts, err := newTransferSideFromDetection(context.Background(), opts, nil, detect, nil, logr.Discard())
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
			sock := filepath.Join(socketDir, "kv", "agent.sock")
			for deadline := time.Now().Add(10 * time.Second); !ts.ready.Load(); time.Sleep(20 * time.Millisecond) {
				select {
				case err := <-done:
					t.Fatalf("transfer side stopped before serving: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no socket at %s within 10 s", sock)
				}
			}
			if _, err := os.Stat(sock); err != nil {
				t.Fatal(err)
			}
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			defer dcancel()
			c, err := fxclient.Dial(dctx, sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			found := false
			for _, e := range c.Info().Engines {
				if e.Name != "rdma" {
					continue
				}
				found = true
				if e.Available || !strings.Contains(e.Reason, tc.want) {
					t.Errorf("rdma engine: available %t, reason %q; want unavailable saying %q", e.Available, e.Reason, tc.want)
				}
			}
			if !found {
				t.Fatalf("GetInfo lists no rdma engine: %v", c.Info().Engines)
			}
		})
	}
}
