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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
		if name == "node-b" { // detection finds RDMA here, but the agent cannot run it: it counts nowhere
			yes, no := true, false
			tn.Status.Engines = []fxv1.EngineAvailability{{Name: "xgmi", Available: true, Running: &yes},
				{Name: "rdma", Available: true, Reason: "2 RoCEv2 ports", Running: &no, RunningReason: "hardware: 2 RoCEv2 ports; not running: libibverbs did not load"}}
		}
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

	// The command as users run it, through a kubeconfig: -n and the context's namespace pick one namespace,
	// -A every one; -o wide adds columns; -o name names objects.
	nsClient, err := ctrlclient.New(cfg, ctrlclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := nsClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Create(ctx, &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "prefill"}}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := writeKubeconfig(t, cfg)
	rows := func(out string) (names []string) {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 2 && (f[0] == "default" || f[0] == "other") {
				names = append(names, f[0]+"/"+f[1])
			}
		}
		return names
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-A"}, []string{"default/kv", "other/prefill"}},
		{[]string{"--all-namespaces"}, []string{"default/kv", "other/prefill"}},
		{[]string{"-n", "other"}, []string{"other/prefill"}},
		{[]string{"--namespace=other"}, []string{"other/prefill"}},
		{[]string{"--context", "envtest"}, []string{"default/kv"}}, // the context's namespace
		{nil, []string{"default/kv"}},
	} {
		out, errOut, code := run(t, append([]string{"status", "--kubeconfig", kubeconfig}, tc.args...)...)
		if code != 0 || !slices.Equal(rows(out), tc.want) {
			t.Errorf("status %v: code %d, pools %v, want %v\n%s%s", tc.args, code, rows(out), tc.want, out, errOut)
		}
	}
	if _, errOut, code := run(t, "status", "--kubeconfig", kubeconfig, "--context", "nonesuch"); code != 1 || !strings.Contains(errOut, "nonesuch") {
		t.Errorf("status --context nonesuch: code %d, %q", code, errOut)
	}

	out2, errOut, code := run(t, "status", "--kubeconfig", kubeconfig, "-A", "-o", "wide")
	if code != 0 {
		t.Fatalf("-o wide: code %d\n%s", code, errOut)
	}
	for _, want := range []string{"NODES PER ENGINE", "rdma=0,xgmi=2", "UNAVAILABLE BECAUSE", "rdma: no NIC", "rdma: hardware: 2 RoCEv2 ports; not running: libibverbs did not load"} {
		if !strings.Contains(out2, want) {
			t.Errorf("-o wide lacks %q:\n%s", want, out2)
		}
	}
	if plain, _, _ := run(t, "status", "--kubeconfig", kubeconfig, "-A"); strings.Contains(plain, "NODES PER ENGINE") || strings.Contains(plain, "no NIC") {
		t.Errorf("the default tables show wide columns:\n%s", plain)
	}
	out2, errOut, code = run(t, "status", "--kubeconfig", kubeconfig, "-A", "-o", "name")
	wantNames := "transferpool.fabricxfer.io/kv\ntransferpool.fabricxfer.io/prefill\ntransfernode.fabricxfer.io/node-a\ntransfernode.fabricxfer.io/node-b\n"
	if code != 0 || out2 != wantNames {
		t.Errorf("-o name: code %d\n%s%s", code, out2, errOut)
	}
	out2, errOut, code = run(t, "status", "--kubeconfig", kubeconfig, "-n", "other", "-o", "json")
	var v statusView
	if err := yaml.Unmarshal([]byte(out2), &v); code != 0 || err != nil || len(v.Pools) != 1 || v.Pools[0].Name != "prefill" ||
		v.Kind != "Status" || v.APIVersion != statusAPIVersion {
		t.Errorf("-n other -o json: code %d, %v, %+v\n%s", code, err, v, errOut)
	}
}

// writeKubeconfig writes a kubeconfig for cfg whose context "envtest" is current, in namespace default.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest", Namespace: "default"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
