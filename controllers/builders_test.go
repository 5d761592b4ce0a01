// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/")

func samplePool() *fxv1.TransferPool {
	return &fxv1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "inference", Name: "kv-cache", UID: types.UID("7f9c1e2a-0000-4000-8000-000000000001")},
		Spec: fxv1.TransferPoolSpec{
			NodeSelector:         map[string]string{"fabricxfer.io/gpu-node": "true"},
			Tolerations:          []corev1.Toleration{{Key: "amd.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Engines:              []fxv1.EngineName{fxv1.EngineXGMI, fxv1.EngineFabric, fxv1.EngineTCP},
			SocketDir:            "/var/run/fabricxfer",
			FabricDomainOverride: "ualink:1/7",
			Memory: fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("64Gi")), HostStaging: ptr(resource.MustParse("2Gi")),
				MaxRegisteredPerCaller: ptr(resource.MustParse("1Gi"))},
			Agent: fxv1.AgentSpec{Image: "ghcr.io/fabricxfer/agent:v0.1.0", HeartbeatSeconds: 10, Port: 7470, PriorityClassName: "system-node-critical"},
		},
	}
}

func TestBuildersMatchGolden(t *testing.T) {
	pool := samplePool()
	objects := map[string]any{
		"daemonset.yaml":          DesiredDaemonSet(pool, AgentSettings{Image: "unused"}),
		"serviceaccount.yaml":     DesiredServiceAccount(pool),
		"role.yaml":               DesiredRole(pool),
		"rolebinding.yaml":        DesiredRoleBinding(pool),
		"clusterrole.yaml":        DesiredClusterRole(pool),
		"clusterrolebinding.yaml": DesiredClusterRoleBinding(pool),
	}
	for name, obj := range objects {
		got, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join("testdata", "golden", name)
		if *updateGolden {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("reading golden file (go test ./controllers -run Golden -update writes it): %v", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from %s:\n%s", name, path, got)
		}
	}
}

func TestDaemonSetDefaultsWhenThePoolSaysLittle(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	ds := DesiredDaemonSet(pool, AgentSettings{Image: "registry.local/agent:dev"})
	c := ds.Spec.Template.Spec.Containers[0]
	if *c.Image != "registry.local/agent:dev" {
		t.Errorf("image %q, want the operator default", *c.Image)
	}
	args := map[string]bool{}
	for _, a := range c.Args {
		args[a] = true
	}
	for _, want := range []string{"--engines=xgmi,fabric,rdma,tcp", "--heartbeat=10s", "--peer-listen=:7470", "--data-listen=:7471", "--health-addr=:7472", "--socket-dir=/run/fabricxfer"} {
		if !args[want] {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	var socketPath string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if *v.Name == "sockets" {
			socketPath = *v.HostPath.Path
		}
	}
	if socketPath != fxv1.DefaultSocketDir {
		t.Errorf("socket hostPath %q, want %q", socketPath, fxv1.DefaultSocketDir)
	}
	if c.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("cpu request %s", c.Resources.Requests.Cpu())
	}
}

func ptr[T any](v T) *T { return &v }
