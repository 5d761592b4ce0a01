// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
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

// TestTCPStagingReported: GetInfo says what the tcp engine does with the node's GPU memory, and why not when it
// does not stage it (no GPU; AMD GPUs, which have no HIP staging).
func TestTCPStagingReported(t *testing.T) {
	tlsDir := filepath.Join(t.TempDir(), "tls")
	var out, errOut bytes.Buffer
	if code := runMain(context.Background(), []string{"certs", "--dir", tlsDir, "--pool-namespace", "inference", "--pool-name", "kv"}, &out, &errOut); code != 0 {
		t.Fatalf("agent certs exited %d: %s", code, errOut.String())
	}
	for _, tc := range []struct{ fixture, want string }{
		{"rdma-only-node", "host memory over TCP; GPU memory not staged: no GPU on this node"},
		{"mi300x-8gpu-roce", "GPU memory not staged: AMD GPU memory has no HIP staging"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			socketDir := t.TempDir()
			fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var cfg runConfig
			cfg.register(fs)
			if err := fs.Parse([]string{"--host-root", filepath.Join(testdata, tc.fixture), "--node-name", "n-1",
				"--pool-namespace", "inference", "--pool-name", "kv", "--socket-dir", socketDir, "--allow-local",
				"--caller-host-root", "/", "--health-addr", "", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
				"--tls-dir", tlsDir, "--libamdhip64", filepath.Join(t.TempDir(), "libamdhip64.so")}); err != nil {
				t.Fatal(err)
			}
			detect, err := cfg.detection.detector()
			if err != nil {
				t.Fatal(err)
			}
			ts, err := buildTransferSide(cfg, nil, detect, logr.Discard())
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
			}
		})
	}
}

// TestCertsCommandRefusesBadInput: every flag's bad value is refused with a clear message and writes nothing;
// an existing pool's certificates are never replaced.
func TestCertsCommandRefusesBadInput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	for _, args := range [][]string{
		{},
		{"--dir", dir, "--validity", "0s"},
		{"--dir", dir, "--validity", "-1h"},
		{"--dir", dir, "--validity", "9000h"},
		{"--dir", dir, "--pool-name", ""},
		{"--dir", dir, "--validity", "soon"},
		{"--dir", dir, "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := runMain(context.Background(), append([]string{"certs"}, args...), &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("agent certs %q exited %d (stderr %q), want 2 with a message", args, code, errOut.String())
		}
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("agent certs %q wrote %s", args, dir)
		}
	}
	var out, errOut bytes.Buffer
	if code := runMain(context.Background(), []string{"certs", "--dir", dir}, &out, &errOut); code != 0 {
		t.Fatalf("agent certs exited %d: %s", code, errOut.String())
	}
	before, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := runMain(context.Background(), []string{"certs", "--dir", dir}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "refusing to replace") {
		t.Fatalf("agent certs over existing certificates exited %d: %s", code, errOut.String())
	}
	after, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the pool's key changed (%v)", err)
	}
}
