// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestAPIDirectoryReadsTransferNodeEndpoints runs against a real API server with the TransferNode CRD: only
// nodes of the pool with an endpoint are peers.
// startAPIServer runs a real kube-apiserver with the TransferNode CRD and returns a client.
func startAPIServer(t *testing.T) ctrlclient.Client {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join("..", "..", "bin")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Skip("kube-apiserver not built: run make tools")
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{
			filepath.Join("..", "..", "config", "crd", "bases", "fabricxfer.io_transfernodes.yaml")}}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := fxv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kube, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// addTransferNode creates a TransferNode of a pool, with an endpoint when one is given.
func addTransferNode(ctx context.Context, t *testing.T, kube ctrlclient.Client, name, pool, endpoint string) {
	t.Helper()
	tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: fxv1.TransferNodeSpec{NodeName: name, PoolNamespace: "infer", PoolName: pool}}
	if err := kube.Create(ctx, tn); err != nil {
		t.Fatalf("creating TransferNode %s: %v", name, err)
	}
	if endpoint != "" {
		tn.Status.Endpoint = endpoint
		if err := kube.Status().Update(ctx, tn); err != nil {
			t.Fatalf("setting the endpoint of %s: %v", name, err)
		}
	}
}

func TestAPIDirectoryReadsTransferNodeEndpoints(t *testing.T) {
	kube := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	add := func(name, pool, endpoint string) { addTransferNode(ctx, t, kube, name, pool, endpoint) }
	add("node-a", "kv", "10.0.0.1:7470")
	add("node-b", "kv", "10.0.0.2:7470")
	add("node-c", "other", "10.0.0.3:7470")
	add("node-d", "kv", "") // agent not reporting yet
	dir := &peers.APIDirectory{Reader: kube, PoolNamespace: "infer", PoolName: "kv", TTL: time.Minute}
	nodes, err := dir.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes["node-a"] != "10.0.0.1:7470" || nodes["node-b"] != "10.0.0.2:7470" {
		t.Fatalf("nodes %v, want node-a and node-b", nodes)
	}
	if ep, err := dir.Endpoint(ctx, "node-b"); err != nil || ep != "10.0.0.2:7470" {
		t.Fatalf("endpoint of node-b: %q, %v", ep, err)
	}
	// A node that is not the pool's is NotFound (a caller retrying Unavailable would retry a mistyped name
	// forever); the pool's own agent without an endpoint yet is Unavailable (it is starting).
	if _, err := dir.Endpoint(ctx, "node-c"); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "pool infer/kv") {
		t.Fatalf("node of another pool: %v, want NotFound naming the pool", err)
	}
	if _, err := dir.Endpoint(ctx, "node-z"); status.Code(err) != codes.NotFound {
		t.Fatalf("a node without a TransferNode: %v, want NotFound", err)
	}
	if _, err := dir.Endpoint(ctx, "node-d"); status.Code(err) != codes.Unavailable {
		t.Fatalf("the pool's node whose agent reports no endpoint yet: %v, want Unavailable", err)
	}
	if _, err := (peers.StaticDirectory{"node-a": "10.0.0.1:7470"}).Endpoint(ctx, "node-aa"); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "--peers") {
		t.Fatalf("a node missing from the static list: %v, want NotFound naming --peers", err)
	}
}
