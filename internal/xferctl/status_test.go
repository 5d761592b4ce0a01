// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestStatusReadsTheAPIServer creates a pool, two nodes and a vPOD in a real API server and checks that
// status shows each with its engines and endpoint.
func TestStatusReadsTheAPIServer(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join("..", "..", "bin")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Skip("kube-apiserver not built: run make tools")
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	defer env.Stop()
	scheme, err := statusScheme() // the scheme the command uses
	if err != nil {
		t.Fatal(err)
	}
	kube, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kube.Create(ctx, &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kv"}}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"node-a", "node-b"} {
		tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: fxv1.TransferNodeSpec{NodeName: name, PoolNamespace: "default", PoolName: "kv"}}
		if err := kube.Create(ctx, tn); err != nil {
			t.Fatal(err)
		}
		// node-a's report was written an hour ago; its agent renewed its heartbeat Lease since (below).
		hb := metav1.NewTime(time.Now().Add(-time.Duration(i+1) * time.Hour))
		tn.Status = fxv1.TransferNodeStatus{Endpoint: "10.0.0." + string(rune('1'+i)) + ":7470", AgentVersion: "v0.1.0", LastHeartbeat: &hb,
			Engines: []fxv1.EngineAvailability{{Name: "xgmi", Available: true}, {Name: "rdma", Available: false, Reason: "no NIC"}}}
		if err := kube.Status().Update(ctx, tn); err != nil {
			t.Fatal(err)
		}
	}
	renewed, holder, secs := metav1.NewMicroTime(time.Now().Add(-5*time.Second)), "node-a", int32(30)
	if err := kube.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "node-a-heartbeat", Labels: map[string]string{fxv1.LabelPoolName: "kv"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renewed, LeaseDurationSeconds: &secs}}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printStatus(ctx, kube, "", "", &out, time.Now()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	poolRow := false
	for _, line := range strings.Split(s, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "default" && f[1] == "kv" {
			poolRow = true
		}
	}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "node-a" && (strings.Contains(line, "1h0m") || !strings.Contains(line, "s ago")) {
			t.Errorf("node-a's heartbeat should come from its Lease (seconds ago), not its hour-old report: %q", line)
		}
		if len(f) > 0 && f[0] == "node-b" && !strings.Contains(line, "2h0m") {
			t.Errorf("node-b has no Lease: its heartbeat is its report's (2h ago): %q", line)
		}
	}
	if !poolRow {
		t.Errorf("status output has no row for pool default/kv:\n%s", s)
	}
	for _, want := range []string{"POOLS (1)", "NODES (2)", "node-a", "default/kv", "xgmi,-rdma", "10.0.0.2:7470", "v0.1.0", "VPODS (0)"} {
		if !strings.Contains(s, want) {
			t.Errorf("status output lacks %q:\n%s", want, s)
		}
	}

	// -o json and -o yaml print the same view for scripts.
	for _, format := range []string{"json", "yaml"} {
		out.Reset()
		if err := printStatus(ctx, kube, "", format, &out, time.Now()); err != nil {
			t.Fatal(err)
		}
		var v statusView
		if err := yaml.Unmarshal(out.Bytes(), &v); err != nil { // YAML is a superset of JSON
			t.Fatalf("-o %s: %v\n%s", format, err, out.String())
		}
		if len(v.Pools) != 1 || v.Pools[0].Name != "kv" || len(v.Nodes) != 2 || v.Nodes[0].Name != "node-a" ||
			!slices.Equal(v.Nodes[0].Engines, []string{"xgmi"}) || !slices.Equal(v.Nodes[0].Unavailable, []string{"rdma"}) ||
			v.Nodes[0].LastHeartbeat == nil || time.Since(v.Nodes[0].LastHeartbeat.Time) > time.Minute || v.VPods == nil {
			t.Errorf("-o %s: %+v", format, v)
		}
	}
	if err := printStatus(ctx, kube, "", "xml", &out, time.Now()); err == nil {
		t.Error("-o xml accepted")
	}
}
