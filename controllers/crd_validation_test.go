// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"sigs.k8s.io/yaml"
)

// TestAPIServerRefusesInvalidObjects sends malformed objects to the real API server and checks that the
// CRD's OpenAPI and CEL rules refuse each with a message that says what is wrong.
func TestAPIServerRefusesInvalidObjects(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	pool := func(spec string) string {
		return "apiVersion: fabricxfer.io/v1alpha1\nkind: TransferPool\nmetadata: {name: bad, namespace: " + ns + "}\nspec:\n" + spec
	}
	node := func(name, spec string) string {
		return "apiVersion: fabricxfer.io/v1alpha1\nkind: TransferNode\nmetadata: {name: " + name + "}\nspec:\n" + spec
	}
	vpod := func(spec string) string {
		return "apiVersion: fabricxfer.io/v1alpha1\nkind: VPodTopology\nmetadata: {name: bad-vpod}\nspec:\n" + spec
	}
	cases := []struct {
		name, object, want string
	}{
		{"unknown engine", pool("  engines: [xgmi, nvme]"), `Unsupported value: "nvme"`},
		{"duplicate engines", pool("  engines: [tcp, tcp]"), "engines must be unique"},
		{"no engines", pool("  engines: []"), "should have at least 1 items"},
		{"relative socket dir", pool("  socketDir: run/fx"), socketDirRefused},
		{"socket dir escaping", pool("  socketDir: /var/../etc"), socketDirRefused},
		{"negative GPU memory", pool("  memory: {perGPU: -1Gi}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"zero host staging", pool("  memory: {hostStaging: '0'}"), "memory.hostStaging must be between 1Mi and 1Ti"},
		{"bad namespace name", pool("  allowedNamespaces: [Inference_NS]"), "spec.allowedNamespaces[0] in body should match"},
		{"every namespace beside names", pool("  allowedNamespaces: [infer, '*']"), "'*' admits every namespace and stands alone"},
		{"heartbeat too fast", pool("  agent: {heartbeatSeconds: 0}"), "spec.agent.heartbeatSeconds in body should be greater than or equal to 1"},
		{"privileged port", pool("  agent: {port: 80}"), "spec.agent.port in body should be greater than or equal to 1024"},
		{"negative poll", pool("  agent: {pollMicroseconds: -1}"), "spec.agent.pollMicroseconds in body should be greater than or equal to 0"},
		{"poll past 100 ms", pool("  agent: {pollMicroseconds: 100001}"), "spec.agent.pollMicroseconds in body should be less than or equal to 100000"},
		{"bad domain override", pool("  fabricDomainOverride: hive:1"), "spec.fabricDomainOverride in body should match"},
		{"too many tolerations", pool("  tolerations:\n" + strings.Repeat("  - {key: a, operator: Exists}\n", 33)), "must have at most 32 items"},
		{"toleration key past a qualified name", pool("  tolerations: [{key: " + strings.Repeat("k", 318) + ", operator: Exists}]"), "a toleration's key is a qualified name: at most 317 characters"},
		{"toleration value past a label value", pool("  tolerations: [{key: k, value: " + strings.Repeat("v", 64) + "}]"), "a toleration's value is a label value: at most 63 characters"},
		{"node name mismatch", node("n1", "  nodeName: n2"), "metadata.name must equal spec.nodeName"},
		{"node without name", node("n1", "  poolName: p"), "spec.nodeName: Required value"},
		{"vpod kind and key disagree", vpod("  kind: nvlink\n  domain: ualink:1/2"), "spec.domain must start with spec.kind"},
		{"vpod unknown kind", vpod("  kind: hive\n  domain: hive:1"), `Unsupported value: "hive"`},
		{"vpod malformed key", vpod("  kind: ualink\n  domain: ualink:one/two"), "spec.domain in body should match"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(tc.object), &obj.Object); err != nil {
				t.Fatalf("test object does not parse: %v", err)
			}
			err := c.Create(context.Background(), obj)
			if err == nil {
				_ = c.Delete(context.Background(), obj)
				t.Fatalf("the API server accepted %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refused with %q, want a message containing %q", err, tc.want)
			}
		})
	}
}

// An agent's token writes its own TransferNode's status: an engine it claims to run must be one detection
// found available there (the same-node engine aside, which copies host memory without GPUs), or the pool's
// counts and the DRA devices would offer it.
func TestAPIServerRefusesARunningEngineDetectionDoesNotAllow(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	tn := &fxv1.TransferNode{}
	tn.Name, tn.Spec.NodeName = "running-claims", "running-claims"
	if err := c.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), tn) })
	yes := true
	tn.Status.Engines = []fxv1.EngineAvailability{{Name: fxv1.EngineRDMA, Available: false, Reason: "no port", Running: &yes}}
	if err := c.Status().Update(ctx, tn); err == nil || !strings.Contains(err.Error(), "an engine runs only where detection finds it available") {
		t.Fatalf("rdma running where unavailable: %v, want it refused", err)
	}
	tn.Status.Engines = []fxv1.EngineAvailability{{Name: fxv1.EngineXGMI, Available: false, Reason: "no GPU detected", Running: &yes}}
	if err := c.Status().Update(ctx, tn); err != nil {
		t.Fatalf("xgmi running on host memory where detection finds no GPU: %v", err)
	}
}

// TestImmutableFields checks the CEL transition rules: changing them would orphan agents or pods.
func TestImmutableFields(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte("apiVersion: fabricxfer.io/v1alpha1\nkind: TransferPool\nmetadata: {name: imm, namespace: "+ns+"}\nspec: {socketDir: /var/run/fabricxfer/a, nodeSelector: {fabricxfer.io/test-group: immutable}}"), &pool.Object); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("creating a valid pool: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
	if err := updateField(ctx, c, pool, "/var/run/fabricxfer/b", "spec", "socketDir"); err == nil || !strings.Contains(err.Error(), "socketDir is immutable") {
		t.Fatalf("changing socketDir: got %v, want it refused as immutable", err)
	}

	vp := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte("apiVersion: fabricxfer.io/v1alpha1\nkind: VPodTopology\nmetadata: {name: imm-vpod}\nspec: {kind: ualink, domain: 'ualink:3/4'}"), &vp.Object); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, vp); err != nil {
		t.Fatalf("creating a valid vpod: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), vp) })
	if err := updateField(ctx, c, vp, "ualink:3/5", "spec", "domain"); err == nil || !strings.Contains(err.Error(), "domain is immutable") {
		t.Fatalf("changing the domain key: got %v, want it refused as immutable", err)
	}
}

// updateField sets one field and updates the object, retrying on conflict: the operator writes finalizers and
// status meanwhile, and the refusal under test must be the CEL rule's, not a stale resourceVersion.
func updateField(ctx context.Context, c client.Client, obj *unstructured.Unstructured, value string, path ...string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		if err := unstructured.SetNestedField(obj.Object, value, path...); err != nil {
			return err
		}
		return c.Update(ctx, obj)
	})
}

// TestAPIServerBoundsReportedGPUs: what an agent (or whoever holds its node's token) reports of its GPUs is
// bounded where the operator copies it into a VPodTopology: a domain size from 1 to 65,536, GPU indexes from 0 to
// 1023 and each once (a domain's members hold such indexes, and one refused member would refuse the domain's
// whole status write), domain keys of the form VPodTopology takes. Anything else is refused with the whole status
// write, so no value outside the bounds reaches the operator.
func TestAPIServerBoundsReportedGPUs(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	tn := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte("apiVersion: fabricxfer.io/v1alpha1\nkind: TransferNode\nmetadata: {name: size-node}\nspec: {nodeName: size-node}"), &tn.Object); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), tn) })
	gpu := func(index int64, domain string, size int64) any {
		return map[string]any{"index": index, "vendor": "amd", "pciBusID": "0000:05:00.0", "numaNode": int64(0),
			"fabric": map[string]any{"kind": "ualink", "domain": domain, "domainSize": size}}
	}
	for _, tc := range []struct {
		name string
		gpus []any
		want string // empty: accepted
	}{
		{"domain size 0", []any{gpu(0, "ualink:9/1", 0)}, "should be greater than or equal to 1"},
		{"domain size -4", []any{gpu(0, "ualink:9/1", -4)}, "should be greater than or equal to 1"},
		{"domain size 65537", []any{gpu(0, "ualink:9/1", 65537)}, "should be less than or equal to 65536"},
		{"domain size 2^40", []any{gpu(0, "ualink:9/1", 1<<40)}, "should be less than or equal to 65536"},
		{"GPU index 1024", []any{gpu(1024, "ualink:9/1", 8)}, "should be less than or equal to 1023"},
		{"GPU index 2^31-1", []any{gpu(1<<31-1, "ualink:9/1", 8)}, "should be less than or equal to 1023"},
		{"GPU index twice", []any{gpu(3, "ualink:9/1", 8), gpu(3, "ualink:9/1", 8)}, "GPU indexes must be unique"},
		{"malformed domain key", []any{gpu(0, "ualink:zz!/x", 8)}, "should match"},
		{"domain key of no kind", []any{gpu(0, "hive:9/1", 8)}, "should match"},
		{"domain size 72", []any{gpu(0, "ualink:9/1", 72)}, ""},
		{"domain size 65536", []any{gpu(0, "ualink:9/1", 65536)}, ""},
		{"GPU indexes 0 and 1023", []any{gpu(0, "nvlink:1c9e2f4a-6b7d.3", 72), gpu(1023, "ualink:9/1", 72)}, ""},
	} {
		if err := unstructured.SetNestedSlice(tn.Object, tc.gpus, "status", "gpus"); err != nil {
			t.Fatal(err)
		}
		err := c.Status().Update(ctx, tn)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want a refusal saying %q", tc.name, err, tc.want)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(tn), tn); err != nil {
			t.Fatal(err)
		}
		if stored, _, _ := unstructured.NestedSlice(tn.Object, "status", "gpus"); tc.want != "" && reflect.DeepEqual(stored, tc.gpus) {
			t.Errorf("%s: refused, yet stored", tc.name)
		}
	}
	// The operator checks keys again as it aggregates (reports stored before the pattern); its check and the
	// API server's agree.
	for _, key := range []string{"ualink:9/1", "nvlink:1c9e2f4a-6b7d.3", "ualink:ABCdef-01/7", "ualink:zz!/x", "hive:9/1",
		"ualink:9/", "UALINK:9/1", "nvlink:1c9e.3.4", "ualink:" + strings.Repeat("a", 130) + "/1"} {
		if err := unstructured.SetNestedSlice(tn.Object, []any{gpu(0, key, 8)}, "status", "gpus"); err != nil {
			t.Fatal(err)
		}
		err := c.Status().Update(ctx, tn)
		if (err == nil) != fxv1.ValidDomainKey(key) {
			t.Errorf("domain key %q: the API server says %v, ValidDomainKey %v", key, err, fxv1.ValidDomainKey(key))
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(tn), tn); err != nil {
			t.Fatal(err)
		}
	}
}
