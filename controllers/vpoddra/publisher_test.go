// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package vpoddra

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

const repoRoot = "../.."

// startAPIServer runs kube-apiserver and etcd (built by make tools), which serve resource.k8s.io/v1.
func startAPIServer(t *testing.T) (kubernetes.Interface, metadata.Interface) {
	t.Helper()
	kube, meta, _ := startAPIServerWithCRDs(t)
	return kube, meta
}

// startAPIServerWithCRDs is startAPIServer with the CRDs of crdDirs installed, and the config to reach it.
func startAPIServerWithCRDs(t *testing.T, crdDirs ...string) (kubernetes.Interface, metadata.Interface, *rest.Config) {
	t.Helper()
	assets, err := filepath.Abs(filepath.Join(repoRoot, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if v := os.Getenv("KUBEBUILDER_ASSETS"); v != "" {
		assets = v
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Skipf("%s not built: run make tools", b)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crdDirs, ErrorIfCRDPathMissing: len(crdDirs) > 0}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return kubernetes.NewForConfigOrDie(cfg), metadata.NewForConfigOrDie(cfg), cfg
}

// startPublisher runs a publisher of devices devices per vPOD until the test ends or stop is called.
func startPublisher(t *testing.T, kube kubernetes.Interface, meta metadata.Interface, devices int) (pub *Publisher, stop func()) {
	t.Helper()
	logger := testr.New(t)
	pub = &Publisher{Kube: kube, Metadata: meta, Devices: devices, Log: &logger}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("publisher: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("publisher did not stop within 30 s")
		}
	}
	t.Cleanup(stop)
	return pub, stop
}

func vpod(name, domain string, nodes ...string) v1alpha1.VPodTopology {
	members := make([]v1alpha1.VPodMember, 0, len(nodes))
	for _, n := range nodes {
		members = append(members, v1alpha1.VPodMember{Node: n, GPUs: []int32{0, 1}})
	}
	return v1alpha1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: domain},
		Status: v1alpha1.VPodTopologyStatus{Members: members, Nodes: int32(len(nodes)), GPUs: int32(2 * len(nodes))}}
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// slicesByName lists every ResourceSlice.
func slicesByName(t *testing.T, kube kubernetes.Interface) map[string]resourceapi.ResourceSlice {
	t.Helper()
	l, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing ResourceSlices: %v", err)
	}
	m := map[string]resourceapi.ResourceSlice{}
	for _, s := range l.Items {
		m[s.Name] = s
	}
	return m
}

// published checks that the slice of v's pool exists with its members as node selector and n devices of v.
func published(s resourceapi.ResourceSlice, v v1alpha1.VPodTopology, n int) error {
	want := Members(v)
	if s.Spec.Driver != DriverName || s.Spec.NodeName != nil || s.Spec.Pool.Name != PoolName(v.Name) || s.Spec.Pool.ResourceSliceCount != 1 {
		return fmt.Errorf("slice %s: driver %q node %v pool %+v", s.Name, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool)
	}
	sel := s.Spec.NodeSelector
	if sel == nil || len(sel.NodeSelectorTerms) != 1 || len(sel.NodeSelectorTerms[0].MatchExpressions) != 1 ||
		!reflect.DeepEqual(sel.NodeSelectorTerms[0].MatchExpressions[0].Values, want) {
		return fmt.Errorf("slice %s node selector %+v, want hostname in %v", s.Name, sel, want)
	}
	if len(s.Spec.Devices) != n {
		return fmt.Errorf("slice %s has %d devices, want %d", s.Name, len(s.Spec.Devices), n)
	}
	for _, d := range s.Spec.Devices {
		if a := d.Attributes["vpod"].StringValue; a == nil || *a != v.Spec.Domain {
			return fmt.Errorf("slice %s device %s vpod %v, want %q", s.Name, d.Name, a, v.Spec.Domain)
		}
	}
	if len(s.Labels) > 0 || len(s.Annotations) > 0 {
		return fmt.Errorf("slice %s carries labels %v annotations %v", s.Name, s.Labels, s.Annotations)
	}
	return nil
}

// TestPublisherWritesOnlyWhatChanged: each vPOD gets one slice named after its pool; a rebuild with the same
// VPodTopologies writes nothing, a changed vPOD rewrites only its slice, and a removed one's slice is deleted.
func TestPublisherWritesOnlyWhatChanged(t *testing.T) {
	kube, meta := startAPIServer(t)
	pub, _ := startPublisher(t, kube, meta, 4)
	a, b, c := vpod("ualink-a", "ualink:p/1", "a1", "a2"), vpod("ualink-b", "ualink:p/2", "b1"), vpod("ualink-c", "ualink:p/3", "c1", "c2")
	pub.Update([]v1alpha1.VPodTopology{a, b, c})
	var first map[string]resourceapi.ResourceSlice
	eventually(t, "three vPOD slices", func() error {
		first = slicesByName(t, kube)
		if len(first) != 3 {
			return fmt.Errorf("%d slices", len(first))
		}
		for _, v := range []v1alpha1.VPodTopology{a, b, c} {
			if err := published(first[SliceName(v.Name)], v, 4); err != nil {
				return err
			}
		}
		return nil
	})

	c2 := vpod("ualink-c", "ualink:p/3", "c1", "c2", "c3")
	pub.Update([]v1alpha1.VPodTopology{vpod("ualink-a", "ualink:p/1", "a1", "a2"), vpod("ualink-b", "ualink:p/2", "b1"), c2})
	eventually(t, "vPOD c's slice rewritten with its third node", func() error {
		return published(slicesByName(t, kube)[SliceName(c2.Name)], c2, 4)
	})
	time.Sleep(time.Second) // a pass writes several pools at once: let it end
	now := slicesByName(t, kube)
	for _, v := range []v1alpha1.VPodTopology{a, b} {
		name := SliceName(v.Name)
		if now[name].ResourceVersion != first[name].ResourceVersion {
			t.Fatalf("slice %s of an unchanged vPOD was written again (resourceVersion %s -> %s)", name, first[name].ResourceVersion, now[name].ResourceVersion)
		}
	}

	pub.Update([]v1alpha1.VPodTopology{a, c2})
	eventually(t, "vPOD b's slice deleted", func() error {
		if s, ok := slicesByName(t, kube)[SliceName(b.Name)]; ok {
			return fmt.Errorf("slice %s still there", s.Name)
		}
		return nil
	})
	if got := slicesByName(t, kube)[SliceName(a.Name)].ResourceVersion; got != first[SliceName(a.Name)].ResourceVersion {
		t.Fatalf("slice of vPOD a written when b went (resourceVersion %s -> %s)", first[SliceName(a.Name)].ResourceVersion, got)
	}
}

// TestPublisherUndoesForeignWrites: whoever else may write ResourceSlices (the agents' role may, for their
// nodes' slices) cannot move a vPOD's devices: a vPOD slice edited to take in another node and another vPOD's
// domain is written back, a forged node-less slice claiming a vPOD's pool at a higher generation is deleted, a
// deleted vPOD slice comes back, a node-bound slice squatting a pool's name is replaced, and the other vPODs'
// slices are not written meanwhile.
func TestPublisherUndoesForeignWrites(t *testing.T) {
	kube, meta := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slices := kube.ResourceV1().ResourceSlices()
	// A squatter holds the name of vPOD c's pool before the publisher runs, bound to one node.
	c := vpod("ualink-c", "ualink:p/3", "c1")
	squat := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: SliceName(c.Name)}, Spec: resourceapi.ResourceSliceSpec{
		Driver: DriverName, NodeName: ptr.To("intruder"), Pool: resourceapi.ResourcePool{Name: PoolName(c.Name), Generation: 7, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "vpod-0"}},
	}}
	if _, err := slices.Create(ctx, squat, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pub, _ := startPublisher(t, kube, meta, 2)
	a, b := vpod("ualink-a", "ualink:p/1", "a1", "a2"), vpod("ualink-b", "ualink:p/2", "b1", "b2")
	pub.Update([]v1alpha1.VPodTopology{a, b, c})
	var before map[string]resourceapi.ResourceSlice
	eventually(t, "three vPOD slices, the squatter replaced", func() error {
		before = slicesByName(t, kube)
		for _, v := range []v1alpha1.VPodTopology{a, b, c} {
			if err := published(before[SliceName(v.Name)], v, 2); err != nil {
				return err
			}
		}
		if len(before) != 3 {
			return fmt.Errorf("%d slices", len(before))
		}
		return nil
	})

	// Edit a's slice: another node in its selector, b's domain on its devices, a label.
	sliceA := before[SliceName(a.Name)]
	edited := sliceA.DeepCopy()
	edited.Labels = map[string]string{"team": "other"}
	edited.Spec.NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"a1", "a2", "intruder"}
	for i := range edited.Spec.Devices {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		for k, v := range edited.Spec.Devices[i].Attributes {
			attrs[k] = v
		}
		attrs["vpod"] = resourceapi.DeviceAttribute{StringValue: ptr.To(b.Spec.Domain)}
		edited.Spec.Devices[i].Attributes = attrs
	}
	if _, err := slices.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("editing vPOD a's slice: %v", err)
	}
	// Forge a slice claiming a's pool at a higher generation, so the scheduler would take it over a's own.
	forged := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "forged"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: DriverName, Pool: resourceapi.ResourcePool{Name: PoolName(a.Name), Generation: 99, ResourceSliceCount: 1},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"intruder"}}}}}},
		Devices: []resourceapi.Device{{Name: "vpod-0"}},
	}}
	if _, err := slices.Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Delete b's slice.
	if err := slices.Delete(ctx, SliceName(b.Name), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's slice written back, the forged one gone, b's back", func() error {
		now := slicesByName(t, kube)
		if _, ok := now["forged"]; ok {
			return fmt.Errorf("forged slice still there")
		}
		if err := published(now[SliceName(a.Name)], a, 2); err != nil {
			return err
		}
		if err := published(now[SliceName(b.Name)], b, 2); err != nil {
			return err
		}
		if len(now) != 3 {
			return fmt.Errorf("%d slices", len(now))
		}
		return nil
	})
	if got := slicesByName(t, kube)[SliceName(c.Name)]; got.ResourceVersion != before[SliceName(c.Name)].ResourceVersion {
		t.Fatalf("vPOD c's slice was written while others were repaired (resourceVersion %s -> %s)", before[SliceName(c.Name)].ResourceVersion, got.ResourceVersion)
	}
}

// TestPublisherAdoptsSlicesAfterARestart: a restarted publisher changes nothing until it has the VPodTopologies,
// then reads each slice once, leaves those that are right unwritten, and deletes what the previous operator's
// slice controller named otherwise.
func TestPublisherAdoptsSlicesAfterARestart(t *testing.T) {
	kube, meta := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := vpod("ualink-a", "ualink:p/1", "a1", "a2"), vpod("ualink-b", "ualink:p/2", "b1")
	pub, stop := startPublisher(t, kube, meta, 3)
	pub.Update([]v1alpha1.VPodTopology{a, b})
	var before map[string]resourceapi.ResourceSlice
	eventually(t, "two vPOD slices", func() error {
		before = slicesByName(t, kube)
		if len(before) != 2 {
			return fmt.Errorf("%d slices", len(before))
		}
		return published(before[SliceName(b.Name)], b, 3)
	})
	stop()
	// What k8s.io/dynamic-resource-allocation's slice controller named a pool's slice.
	sliceA := before[SliceName(a.Name)]
	old := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "0-fabricxfer.io-"}, Spec: *sliceA.Spec.DeepCopy()}
	old, err := kube.ResourceV1().ResourceSlices().Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	pub2, _ := startPublisher(t, kube, meta, 3)
	// Until it has the VPodTopologies, a restarted publisher takes nothing down.
	time.Sleep(2 * time.Second)
	if now := slicesByName(t, kube); len(now) != 3 || now[SliceName(a.Name)].ResourceVersion != before[SliceName(a.Name)].ResourceVersion {
		t.Fatalf("before its first list of VPodTopologies the restarted publisher changed the slices: %v", keys(now))
	}
	d := vpod("ualink-d", "ualink:p/4", "d1")
	pub2.Update([]v1alpha1.VPodTopology{a, b, d})
	eventually(t, "the old slice gone and d's published", func() error {
		now := slicesByName(t, kube)
		if _, ok := now[old.Name]; ok {
			return fmt.Errorf("slice %s of the previous operator still there", old.Name)
		}
		return published(now[SliceName(d.Name)], d, 3)
	})
	time.Sleep(time.Second) // a pass writes several pools at once: let it end
	now := slicesByName(t, kube)
	for _, v := range []v1alpha1.VPodTopology{a, b} {
		name := SliceName(v.Name)
		if now[name].ResourceVersion != before[name].ResourceVersion {
			t.Fatalf("restarted publisher rewrote the unchanged slice %s (resourceVersion %s -> %s)", name, before[name].ResourceVersion, now[name].ResourceVersion)
		}
	}
}

// TestHostileVPodTopologiesCostOnlyTheirOwnPool: an admin-declared VPodTopology may carry a 253-character name
// (its pool's name is too long for a slice) and members whose names no hostname label can hold. The first is
// refused with the reason and publishes nothing, the second publishes its other members only, and the other
// vPODs are published as ever.
func TestHostileVPodTopologiesCostOnlyTheirOwnPool(t *testing.T) {
	long := strings.Repeat("a", 253)
	longNode := strings.Repeat("n", 64)
	good := vpod("ualink-good", "ualink:p/1", "g1")
	longName := vpod(long, "ualink:p/2", "x1")
	longMember := vpod("ualink-member", "ualink:p/3", "m1", longNode)
	onlyLong := vpod("ualink-only", "ualink:p/4", longNode)

	specs, refused := Specs(Resources([]v1alpha1.VPodTopology{good, longName, longMember, onlyLong}, 2))
	if reason := refused[PoolName(long)]; !strings.Contains(reason, "no ResourceSlice name") || !strings.Contains(reason, "253") {
		t.Fatalf("pool of a 253-character VPodTopology name refused with %q, want the name's length named", reason)
	}
	if len(refused) != 1 || len(specs) != 2 {
		t.Fatalf("specs %v, refused %v: want good and member published, only the long name refused", keys(specs), refused)
	}
	if got := specs[SliceName(longMember.Name)].NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values; !reflect.DeepEqual(got, []string{"m1"}) {
		t.Fatalf("selector values %v, want [m1]: a name no label can hold is left out", got)
	}
	if _, ok := specs[SliceName(onlyLong.Name)]; ok {
		t.Fatal("a vPOD whose only member no hostname label can hold got a pool")
	}

	kube, meta := startAPIServer(t)
	pub, _ := startPublisher(t, kube, meta, 2)
	pub.Update([]v1alpha1.VPodTopology{good, longName, longMember, onlyLong})
	eventually(t, "the two publishable vPODs", func() error {
		now := slicesByName(t, kube)
		if len(now) != 2 {
			return fmt.Errorf("%d slices", len(now))
		}
		if err := published(now[SliceName(good.Name)], good, 2); err != nil {
			return err
		}
		s := now[SliceName(longMember.Name)]
		if v := s.Spec.NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values; !reflect.DeepEqual(v, []string{"m1"}) {
			return fmt.Errorf("member vPOD selector %v", v)
		}
		return nil
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestUpdateReusesTheSpecsOfUnchangedVPods: a rebuild after one VPodTopology changed builds only that pool's
// spec again; the others keep theirs (and so are compared by pointer, and allocate nothing).
func TestUpdateReusesTheSpecsOfUnchangedVPods(t *testing.T) {
	p := &Publisher{Devices: 2}
	a, b := vpod("ualink-a", "ualink:p/1", "a1"), vpod("ualink-b", "ualink:p/2", "b1")
	p.Update([]v1alpha1.VPodTopology{a, b})
	first := p.desired
	b2 := vpod("ualink-b", "ualink:p/2", "b1", "b2")
	p.Update([]v1alpha1.VPodTopology{vpod("ualink-a", "ualink:p/1", "a1"), b2})
	if p.desired[SliceName(a.Name)] != first[SliceName(a.Name)] {
		t.Fatal("the unchanged vPOD's spec was built again")
	}
	if p.desired[SliceName(b.Name)] == first[SliceName(b.Name)] {
		t.Fatal("the changed vPOD kept its old spec")
	}
	if got := p.desired[SliceName(b.Name)].NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values; !reflect.DeepEqual(got, []string{"b1", "b2"}) {
		t.Fatalf("changed vPOD's nodes %v", got)
	}
	gone := b2
	gone.Status.MissingMembers = []string{"b2"}
	p.Update([]v1alpha1.VPodTopology{a, gone})
	if got := p.desired[SliceName(b.Name)].NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values; !reflect.DeepEqual(got, []string{"b1"}) {
		t.Fatalf("a missing member is a change: nodes %v", got)
	}
	p.Update([]v1alpha1.VPodTopology{a})
	if _, ok := p.desired[SliceName(b.Name)]; ok || len(p.desired) != 1 {
		t.Fatalf("desired pools %v after b went", keys(p.desired))
	}
}

// stallCreates is a transport that holds every request creating a slice whose body names pool until the
// request's context ends, as an API server or proxy that never answers does.
type stallCreates struct {
	next http.RoundTripper
	pool string
}

func (s stallCreates) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(s.pool)) { // JSON or protobuf: the name is in it as is
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
	}
	return s.next.RoundTrip(req)
}

// TestAStalledWriteCostsOnlyItsPool: the publisher writes one slice at a time, so a write the API server never
// answers held every other vPOD's slice back for as long as it stalled; each write now ends within WriteLimit
// and the next pool is published.
func TestAStalledWriteCostsOnlyItsPool(t *testing.T) {
	_, meta, cfg := startAPIServerWithCRDs(t)
	stalled := rest.CopyConfig(cfg)
	stalled.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return stallCreates{next: rt, pool: PoolName("ualink-a")}
	}
	kube := kubernetes.NewForConfigOrDie(stalled)
	logger := testr.New(t)
	pub := &Publisher{Kube: kube, Metadata: meta, Devices: 2, Log: &logger, WriteLimit: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Start(ctx) }()
	defer func() { cancel(); <-done }()
	a, b := vpod("ualink-a", "ualink:p/1", "a1"), vpod("ualink-b", "ualink:p/2", "b1")
	pub.Update([]v1alpha1.VPodTopology{a, b}) // pools are written in name order: a's stalls first
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := slicesByName(t, kubernetes.NewForConfigOrDie(cfg))
		if s, ok := now[SliceName(b.Name)]; ok {
			if err := published(s, b, 2); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("vPOD b's slice was not published within 10 s while vPOD a's create stalled")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPublisherMovesSlicesOffTheOldPoolName: vPOD pools were named vpod-<x>, which a node named so also names
// its own pool: a slice of the old name is replaced by one of pool vpod/<x> (a pool's name cannot change in
// place), and the node's slice of pool vpod-<x> stays as it is, a pool apart.
func TestPublisherMovesSlicesOffTheOldPoolName(t *testing.T) {
	kube, meta := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slices := kube.ResourceV1().ResourceSlices()
	a := vpod("ualink-a", "ualink:p/1", "a1", "a2")
	old := "vpod-" + a.Name
	before := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: SliceName(a.Name)}, Spec: resourceapi.ResourceSliceSpec{
		Driver: DriverName, Pool: resourceapi.ResourcePool{Name: old, Generation: 3, ResourceSliceCount: 1},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"a1", "a2"}}}}}},
		Devices: []resourceapi.Device{{Name: "vpod-0"}},
	}}
	node := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: old + "-fabricxfer.io-x7k2q"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: DriverName, NodeName: ptr.To(old), Pool: resourceapi.ResourcePool{Name: old, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "channel-0"}},
	}}
	var err error
	for _, s := range []**resourceapi.ResourceSlice{&before, &node} {
		if *s, err = slices.Create(ctx, *s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if v1alpha1.IsVPodDRAPool(old) {
		t.Fatalf("pool %s of node %s read as a vPOD's", old, old)
	}
	pub, _ := startPublisher(t, kube, meta, 2)
	pub.Update([]v1alpha1.VPodTopology{a})
	eventually(t, "vPOD a's slice in pool "+PoolName(a.Name), func() error {
		s := slicesByName(t, kube)[SliceName(a.Name)]
		if s.UID == before.UID {
			return fmt.Errorf("slice %s is the one of pool %s still", s.Name, s.Spec.Pool.Name)
		}
		if s.Spec.Pool.Generation != 1 {
			return fmt.Errorf("slice %s of a new pool at generation %d", s.Name, s.Spec.Pool.Generation)
		}
		return published(s, a, 2)
	})
	got, err := slices.Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s's slice after the publisher ran: %v", old, err)
	}
	if got.ResourceVersion != node.ResourceVersion || got.Spec.Pool.Name != old {
		t.Fatalf("node %s's slice written by the publisher: pool %s, resourceVersion %s -> %s", old, got.Spec.Pool.Name, node.ResourceVersion, got.ResourceVersion)
	}
}
