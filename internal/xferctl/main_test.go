// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/syncbuf"
)

// TestMain lets the test binary stand in for xferctl when bench starts "xferctl local-agent" as a child.
func TestMain(m *testing.M) {
	if os.Getenv("XFERCTL_AS_MAIN") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := Run(ctx, Program{Name: "xferctl", Version: "test"}, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Setenv("XFERCTL_AS_MAIN", "1") // children of this test binary run main
	code := m.Run()
	os.Exit(code)
}

func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb syncbuf.Buffer
	code := Run(ctx, Program{Name: "xferctl", Version: "test"}, args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestUsage(t *testing.T) {
	if _, errOut, code := run(t); code != 2 || !strings.Contains(errOut, "bench") {
		t.Fatalf("no command: code %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "frobnicate"); code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: code %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "transfer", "--to", "", "--socket", "/nonexistent"); code != 1 || !strings.Contains(errOut, "--to") {
		t.Fatalf("transfer without a target: code %d, %q", code, errOut)
	}
}

// TestBenchMeasuresSocketAndDirectPaths runs bench as users do (it starts a local agent process) with few
// iterations, and checks the report's shape, not its speed.
func TestBenchMeasuresSocketAndDirectPaths(t *testing.T) {
	out, errOut, code := run(t, "bench", "--iterations", "300", "--warmup", "30", "--json")
	if code != 0 {
		t.Fatalf("bench: code %d\n%s", code, errOut)
	}
	var rep struct {
		Size    uint64 `json:"size_bytes"`
		Results []latency
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench output is not JSON: %v\n%s", err, out)
	}
	if rep.Size != 4096 || len(rep.Results) != 8 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Iterations != 300 || r.P50us <= 0 || r.P99us < r.P50us || r.MaxUs < r.P99us {
			t.Errorf("implausible summary %+v", r)
		}
	}
	if !strings.HasPrefix(rep.Results[6].Path, "direct") {
		t.Errorf("seventh path %q, want the direct engine call", rep.Results[6].Path)
	}
	if !strings.Contains(rep.Results[0].Path, "mailbox") || !strings.Contains(rep.Results[1].Path, "frames on the socket") {
		t.Errorf("first paths %q, %q: want the fast socket with its mailbox, then without", rep.Results[0].Path, rep.Results[1].Path)
	}
}

// TestSmokeCommandsAgainstALocalAgent: local-agent serves; register holds a segment; transfer writes and
// verifies it; explain names the engine; info describes the caller.
func TestSmokeCommandsAgainstALocalAgent(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var agentOut, agentErr syncbuf.Buffer
	agentDone := make(chan int, 1)
	go func() {
		agentDone <- Run(ctx, Program{Name: "xferctl"}, []string{"local-agent", "--socket-dir", dir, "--pool-name", "kv", "--node-name", "node-a"}, &agentOut, &agentErr)
	}()
	socket := filepath.Join(dir, "kv", "agent.sock")
	waitFor(t, func() bool { return strings.Contains(agentOut.String(), "ready:") }, "local agent")

	holdCtx, stopHold := context.WithCancel(ctx)
	var regOut, regErr syncbuf.Buffer
	regDone := make(chan int, 1)
	go func() {
		regDone <- Run(holdCtx, Program{Name: "xferctl"}, []string{"register", "--socket", socket, "--size", "64Ki", "--segment", "kv-0"}, &regOut, &regErr)
	}()
	waitFor(t, func() bool { return strings.Contains(regOut.String(), "registered") }, "registered segment")

	out, errOut, code := run(t, "transfer", "--socket", socket, "--to", "kv-0", "--size", "16Ki", "--offset", "4096")
	if code != 0 || !strings.Contains(out, "verified: read back 16384 bytes") {
		t.Fatalf("transfer: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, "transfer", "--socket", socket, "--to", "kv-0", "--size", "16Ki", "--offset", "32Ki")
	if code != 0 || !strings.Contains(out, "verified: read back 16384 bytes") {
		t.Fatalf("transfer at an offset given as a quantity: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, "explain", "--socket", socket, "--from", "kv-0", "--to", "node-a/kv-0")
	if code != 0 || !strings.Contains(out, "kv-0 -> node-a/kv-0: xgmi") {
		t.Fatalf("explain: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, "info", "--socket", socket)
	if code != 0 || !strings.Contains(out, "pool default/kv, at "+socket) || !strings.Contains(out, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("info: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run(t, "transfer", "--socket", socket, "--to", "kv-0", "--size", "1Mi")
	if code != 1 || !strings.Contains(errOut, "OutOfRange") {
		t.Fatalf("transfer past the segment: code %d\n%s%s", code, out, errOut)
	}

	stopHold()
	if c := <-regDone; c != 0 {
		t.Fatalf("register exited %d: %s", c, regErr.String())
	}
	cancel()
	select {
	case c := <-agentDone:
		if c != 0 {
			t.Fatalf("local agent exited %d: %s", c, agentErr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("local agent did not stop")
	}
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
