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

	"github.com/go-logr/logr"

	fxclient "github.com/fabricxfer/fabricxfer/client"
)

// TestTCPStagingReported: GetInfo says what the tcp engine does with the node's GPU memory, and why not when it
// does not stage it (no GPU; AMD GPUs, which have no HIP staging).
func TestTCPStagingReported(t *testing.T) {
	tlsDir := filepath.Join(t.TempDir(), "tls")
	if err := WritePoolCertificates(tlsDir, "inference", "kv", 24*time.Hour); err != nil {
		t.Fatalf("writing the pool's certificates: %v", err)
	}
	for _, tc := range []struct{ fixture, want string }{
		{"rdma-only-node", "host memory over TCP; GPU memory not staged: no GPU on this node"},
		{"mi300x-8gpu-roce", "GPU memory not staged: AMD GPU memory has no HIP staging"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			socketDir := t.TempDir()
			fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var opts Options
			opts.RegisterFlags(fs)
			if err := fs.Parse([]string{"--host-root", filepath.Join(testdata, tc.fixture), "--node-name", "n-1",
				"--pool-namespace", "inference", "--pool-name", "kv", "--socket-dir", socketDir, "--allow-local",
				"--caller-host-root", "/", "--health-addr", "", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
				"--tls-dir", tlsDir, "--libamdhip64", filepath.Join(t.TempDir(), "libamdhip64.so")}); err != nil {
				t.Fatal(err)
			}
			detect, err := opts.Detection.detector(nil)
			if err != nil {
				t.Fatal(err)
			}
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
				case <-done:
				case <-time.After(10 * time.Second):
					t.Error("transfer side did not stop within 10 s")
				}
			}()
			sock := filepath.Join(socketDir, "kv", "agent.sock")
			for deadline := time.Now().Add(10 * time.Second); !ts.ready.Load(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no socket at %s within 10 s", sock)
				}
			}
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			defer dcancel()
			c, err := fxclient.Dial(dctx, sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, e := range c.Info().Engines {
				if e.Name == "tcp" && (!e.Available || !strings.Contains(e.Reason, tc.want)) {
					t.Errorf("tcp engine: available %t, reason %q; want available saying %q", e.Available, e.Reason, tc.want)
				}
				if wire := "data over mutual TLS, in AES-GCM records keyed from the TLS session"; e.Name == "tcp" && !strings.Contains(e.Reason, wire) {
					t.Errorf("tcp engine reason %q does not say how data travels (%q)", e.Reason, wire)
				}
			}
		})
	}
}
