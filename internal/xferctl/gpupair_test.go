// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestExplainGPUPairsByDeclaration: on a real API server, two GPUs of one declared vPOD on two nodes are a
// fabric pair decided by that declaration; GPUs of two declared vPODs are not (rdma where both nodes run it,
// then tcp where both stage GPU memory), and explain names each GPU's declaration. Engines count where the
// nodes' agents run them, not where detection allows them. Bad references
// are refused with the reason.
func TestExplainGPUPairsByDeclaration(t *testing.T) {
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
	defer func() { _ = env.Stop() }()
	scheme, err := statusScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	declared := func(domain, vp string) *fxv1.FabricMembership {
		return &fxv1.FabricMembership{Kind: fxv1.FabricUALink, Domain: domain, Source: fxv1.FabricDeclared, Declaration: vp}
	}
	yes, no := true, false
	older := func(rdma bool) []fxv1.EngineAvailability { // an agent older than the running field
		return []fxv1.EngineAvailability{{Name: "xgmi", Available: true}, {Name: "fabric", Available: true},
			{Name: "rdma", Available: rdma, Reason: "no usable port"}, {Name: "tcp", Available: true}}
	}
	staged := "GPU memory staged through pinned host memory (up to 64 MiB per peer and side)"
	for _, n := range []struct {
		name    string
		engines []fxv1.EngineAvailability
	}{{"node-a", older(true)}, {"node-b", older(true)}, {"node-c", older(false)},
		{"node-d", []fxv1.EngineAvailability{{Name: "xgmi", Available: true, Running: &yes, GPUMemory: &yes},
			{Name: "fabric", Available: true, Running: &no, RunningReason: "hardware: ok; not running: no GPU runtime for these GPUs"},
			{Name: "rdma", Available: true, Running: &no, RunningReason: "hardware: 2 ports; not running: libibverbs did not load"},
			{Name: "tcp", Available: true, Running: &yes, RunningReason: "always; " + staged, GPUMemory: &yes}}},
		// No GPU runtime loaded: the same-node engine copies host memory only and tcp stages nothing, though
		// tcp's detection reason names staging (NVIDIA GPU memory is staged "when the CUDA driver loads").
		{"node-f", []fxv1.EngineAvailability{
			{Name: "xgmi", Available: true, Running: &yes, RunningReason: "hardware: 8 GPUs; host backend only: the CUDA driver did not load", GPUMemory: &no},
			{Name: "fabric", Available: true, Running: &no, RunningReason: "hardware: ok; not running: no GPU runtime \x1b[31mfor these GPUs"},
			{Name: "rdma", Available: true, Running: &no, RunningReason: "hardware: 2 ports; not running: libibverbs did not load"},
			{Name: "tcp", Available: true, Reason: "NVIDIA GPU memory staged through pinned host memory when the CUDA driver loads", Running: &yes,
				RunningReason: "always; GPU memory not staged: the CUDA driver did not load", GPUMemory: &no}}},
		{"node-e", []fxv1.EngineAvailability{{Name: "xgmi", Available: true, Running: &yes, GPUMemory: &yes}, {Name: "fabric", Available: true, Running: &yes, GPUMemory: &yes},
			{Name: "rdma", Available: true, Running: &yes}, {Name: "tcp", Available: true, Running: &yes, RunningReason: "always; " + staged, GPUMemory: &yes}}},
	} {
		tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: fxv1.TransferNodeSpec{NodeName: n.name}}
		if err := kube.Create(ctx, tn); err != nil {
			t.Fatal(err)
		}
		tn.Status = fxv1.TransferNodeStatus{
			GPUs: []fxv1.GPU{
				{Index: 0, Vendor: fxv1.VendorAMD, PCIBusID: "0000:01:00.0", Fabric: declared("ualink:77/1", "vpod-left")},
				{Index: 1, Vendor: fxv1.VendorAMD, PCIBusID: "0000:02:00.0", Fabric: declared("ualink:77/2", "vpod-right")},
				{Index: 2, Vendor: fxv1.VendorAMD, PCIBusID: "0000:03:00.0"},
			},
			Engines: n.engines,
		}
		if err := kube.Status().Update(ctx, tn); err != nil {
			t.Fatal(err)
		}
	}
	explain := func(from, to string) (string, error) {
		var out bytes.Buffer
		src, err := parseGPURef(from)
		if err != nil {
			return "", err
		}
		dst, err := parseGPURef(to)
		if err != nil {
			return "", err
		}
		err = writeGPURoute(ctx, kube, src, dst, from, to, &out)
		return out.String(), err
	}
	for _, c := range []struct {
		from, to string
		want     []string
	}{
		{"node-a/0", "node-b/0", []string{"node-a/0 -> node-b/0: fabric", "node-a GPU 0: ualink:77/1, declared by VPodTopology vpod-left",
			"fabric    yes  same fabric domain ualink:77/1, decided by VPodTopology vpod-left"}},
		{"node-a/0", "node-b/1", []string{"node-a/0 -> node-b/1: rdma", "node-b GPU 1: ualink:77/2, declared by VPodTopology vpod-right",
			"fabric    no   different fabric domains", "rdma      yes  both nodes run rdma"}},
		{"node-a/2", "node-b/2", []string{": rdma", "node-a GPU 2: in no fabric domain", "outside any fabric domain"}},
		{"node-a/1", "node-c/0", []string{": no engine", "rdma      no   not available on node-c: no usable port",
			"tcp       no   the agent on node-a does not say whether tcp stages its GPU memory"}},
		{"node-a/0", "node-a/1", []string{": xgmi", "both GPUs on node node-a"}},
		// Detection allows fabric and rdma on node-d, but its agent runs neither: tcp carries the pair, and the
		// fabric line still names the declaration that put both GPUs in one domain.
		{"node-d/0", "node-e/0", []string{"node-d/0 -> node-e/0: tcp",
			"fabric    no   same fabric domain ualink:77/1, decided by VPodTopology vpod-left, but the fabric engine is not running on node-d: hardware: ok; not running: no GPU runtime",
			"rdma      no   not running on node-d: hardware: 2 ports; not running: libibverbs did not load",
			"tcp       yes  both nodes run tcp and stage GPU memory"}},
		{"node-e/0", "node-e/1", []string{": xgmi"}},
		// Nothing runs between them, but detection allows fabric on both: explain says what would carry it.
		{"node-d/0", "node-f/0", []string{"node-d/0 -> node-f/0: no engine running, fabric once both agents run it",
			"tcp       no   tcp runs on node-f without staging its GPU memory: always; GPU memory not staged"}},
		{"node-f/0", "node-f/1", []string{"node-f/0 -> node-f/1: no engine",
			"xgmi      no   the same-node engine on node-f copies host memory only: hardware: 8 GPUs; host backend only"}},
		// What an agent wrote reaches the terminal without its control characters.
		{"node-f/0", "node-e/0", []string{"not running on node-f: hardware: ok; not running: no GPU runtime ?[31mfor these GPUs"}},
		{"node-d/0", "node-f/1", []string{"node-d/0 -> node-f/1: no engine running, rdma once both agents run it"}},
		{"node-e/0", "node-d/1", []string{": tcp", "fabric    no   different fabric domains", "rdma      no   not running on node-d"}},
	} {
		out, err := explain(c.from, c.to)
		if err != nil {
			t.Errorf("%s -> %s: %v", c.from, c.to, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s -> %s: output lacks %q:\n%s", c.from, c.to, w, out)
			}
		}
	}
	for _, bad := range []struct{ from, to, want string }{
		{"node-a", "node-b/0", "want node/index"},
		{"node-a/x", "node-b/0", "want node/index"},
		{"node-a/-1", "node-b/0", "want node/index"},
		{"/0", "node-b/0", "want node/index"},
		{"node-a/0", "node-b/99999999999999999999", "want node/index"},
		{"node-a/0", "node-b/7", "node node-b reports 3 GPUs, no GPU 7"},
		{"node-a/0", "missing/0", "reading the TransferNode of missing"},
	} {
		if _, err := explain(bad.from, bad.to); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s -> %s: error %v, want one containing %q", bad.from, bad.to, err, bad.want)
		}
	}
}
