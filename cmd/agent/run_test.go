// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fabricxfer/fabricxfer/agent/node"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/syncbuf"
)

// TestRunReportsUntilStopped runs "agent run" as the demo does (a kubeconfig, a fixture root, a node name
// from NODE_NAME) against a real API server, and stops it the way SIGTERM does.
func TestRunReportsUntilStopped(t *testing.T) {
	assets, _ := filepath.Abs("../../bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Skipf("%s not built: run make tools", b)
		}
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{"../../config/crd/bases/fabricxfer.io_transfernodes.yaml"},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "agent", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rdma-1"}}); err != nil {
		t.Fatal(err)
	}
	t.Setenv(node.EnvNodeName, "rdma-1")

	var stderr syncbuf.Buffer
	exit := make(chan int, 1)
	socketDir := t.TempDir()
	healthAddr := freeAddr(t)
	go func() {
		exit <- runMain(ctx, []string{"run", "--host-root", filepath.Join(testdata, "rdma-only-node"), "--kubeconfig", kcPath,
			"--pool-namespace", "inference", "--pool-name", "kv", "--heartbeat", "1s", "--advertise", "192.0.2.10:7470",
			"--socket-dir", socketDir, "--tls-dir", "", "--health-addr", healthAddr, "--allow-local",
			"--log-format", "json", "--log-level", "debug"}, &bytes.Buffer{}, &stderr)
	}()
	var tn v1alpha1.TransferNode
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := c.Get(ctx, client.ObjectKey{Name: "rdma-1"}, &tn)
		if err == nil && tn.Status.LastHeartbeat != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TransferNode within 15s (%v); agent log:\n%s", err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if tn.Spec.PoolName != "kv" || tn.Status.Endpoint != "192.0.2.10:7470" || len(tn.Status.NICs) != 2 || tn.Status.AgentVersion != version {
		t.Errorf("TransferNode spec %+v status %+v", tn.Spec, tn.Status)
	}
	// The transfer side serves the pool's socket next to the reporter, and removes it on shutdown.
	sock := filepath.Join(socketDir, "kv", "agent.sock")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket at %s within 10s; agent log:\n%s", sock, stderr.String())
		}
	}
	// Once its engines are assembled the report says which run, at once rather than a heartbeat later: on this
	// machine without GPUs, certificates or libibverbs the same-node engine copies host memory and nothing else
	// runs, whatever detection found possible.
	running := map[v1alpha1.EngineName]v1alpha1.EngineAvailability{}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := c.Get(ctx, client.ObjectKey{Name: "rdma-1"}, &tn); err == nil && len(tn.Status.Engines) == 4 &&
			tn.Status.Engines[0].Running != nil && tn.Status.Engines[0].RunningReason != "starting: the agent has not assembled its engines yet" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the report does not say which engines run within 5s of the socket: %+v", tn.Status.Engines)
		}
	}
	for _, e := range tn.Status.Engines {
		running[e.Name] = e
	}
	xgmi, rdma, tcp := running[v1alpha1.EngineXGMI], running[v1alpha1.EngineRDMA], running[v1alpha1.EngineTCP]
	if xgmi.Available || !xgmi.Runs() || !strings.Contains(xgmi.RunningReason, "host memory only") {
		t.Errorf("xgmi on a node without GPUs: %+v, want detected unavailable, running host memory only", xgmi)
	}
	if !rdma.Available || rdma.Runs() || !strings.Contains(rdma.RunningReason, "not running") {
		t.Errorf("rdma without certificates or libibverbs: %+v, want detected available, not running, saying why", rdma)
	}
	if !tcp.Available || tcp.Runs() || !strings.Contains(tcp.RunningReason, "--tls-dir") {
		t.Errorf("tcp without certificates: %+v, want detected available, not running, naming --tls-dir", tcp)
	}
	// The health address also serves metrics: the runtime's and the process's, for watching an agent for leaks.
	metrics := httpGet(t, "http://"+healthAddr+"/metrics")
	for _, want := range []string{"go_goroutines ", "process_open_fds ", "process_resident_memory_bytes ",
		"fabricxfer_agent_regions{", "fabricxfer_agent_limit_refusals_total{", "fabricxfer_agent_sessions ",
		"fabricxfer_agent_fabric_mapped_regions "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%.2000s", want, metrics)
		}
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("agent run exited %d after stop; log:\n%s", code, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent run did not stop within 5s")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket %s left behind after stop: %v", sock, err)
	}
	if log := stderr.String(); !strings.Contains(log, "agent started") || !strings.Contains(log, "agent stopped") {
		t.Errorf("agent log lacks start/stop lines:\n%s", log)
	}
	// --log-format=json: every line one object with the operator's keys.
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON (%v): %s", err, line)
			continue
		}
		if entry["ts"] == nil || entry["level"] == nil || entry["msg"] == nil {
			t.Errorf("log line lacks ts, level or msg: %s", line)
		}
	}
}

// freeAddr returns a loopback address with a port nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// httpGet fetches url within 5 s and returns the body.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}
