// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/metadata"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers/vpoddra"
)

// specPath is where the driver started in dir keeps claim's CDI spec.
func specPath(dir string, c *resourceapi.ResourceClaim) string {
	return filepath.Join(dir, "cdi", "fabricxfer.io-"+string(c.UID)+".json")
}

// mustPrepare prepares claims over the socket and fails the test unless every one was prepared.
func mustPrepare(ctx context.Context, t *testing.T, k kubelet, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	resp, err := k.prepare(ctx, claims...)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	for _, c := range claims {
		if e := resp.Claims[string(c.UID)].GetError(); e != "" || len(resp.Claims[string(c.UID)].GetDevices()) == 0 {
			t.Fatalf("claim %s not prepared: %q", c.Name, e)
		}
	}
}

// readAll reads files by path; a missing one reads as nil.
func readAll(t *testing.T, paths ...string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		out[p] = b
	}
	return out
}

// TestUnprepareRemovesOnlyTheNamedClaimsSpec: NodeUnprepareResources whose claim UID is a path ("/../x") or
// another claim's UID under a different namespace/name answers that claim with an error and removes nothing:
// not a file elsewhere the agent can write, not another CDI vendor's spec, not another claim's spec. The plugin
// keeps serving: the claims' own unprepare and a new prepare work afterwards.
func TestUnprepareRemovesOnlyTheNamedClaimsSpec(t *testing.T) {
	cs, ctx, r, k := oneNode(t)
	a := allocatedClaim(t, cs, "kv-a", dra.PoolName("gpu-node-a"), "channel-0")
	b := allocatedClaim(t, cs, "kv-b", dra.PoolName("gpu-node-a"), "channel-1")
	mustPrepare(ctx, t, k, a, b)

	bystanders := []string{
		filepath.Join(r.dir, "registry", "other-driver.json"), // beside the CDI directory
		filepath.Join(r.dir, "cdi", "nvidia.com-gpu.json"),    // another vendor's spec
		filepath.Join(r.dir, "checkpoint.json"),               // above it
	}
	for _, p := range bystanders {
		if err := os.WriteFile(p, []byte(`{"keep":"me"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	watched := append([]string{specPath(r.dir, a), specPath(r.dir, b)}, bystanders...)
	before := readAll(t, watched...)

	hostile := []struct {
		claim *drapb.Claim
		want  string
	}{
		{&drapb.Claim{Namespace: "evil", Name: "x", Uid: "/../../registry/other-driver"}, "is not a Kubernetes UID"},
		{&drapb.Claim{Namespace: "evil", Name: "y", Uid: "/../nvidia.com-gpu"}, "is not a Kubernetes UID"},
		{&drapb.Claim{Namespace: "evil", Name: "z", Uid: "/../../checkpoint"}, "is not a Kubernetes UID"},
		{&drapb.Claim{Namespace: "evil", Name: "upper", Uid: strings.ToUpper(string(a.UID))}, "is not a Kubernetes UID"},
		{&drapb.Claim{Namespace: "evil", Name: "not-kv-b", Uid: string(b.UID)}, `was prepared for claim "default/kv-b"; the file is kept`},
	}
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, h := range hostile {
		req.Claims = append(req.Claims, h.claim)
	}
	resp, err := k.c.NodeUnprepareResources(ctx, req)
	if err != nil {
		t.Fatalf("NodeUnprepareResources with hostile claims failed as a whole: %v", err)
	}
	for _, h := range hostile {
		if e := resp.Claims[h.claim.Uid].GetError(); !strings.Contains(e, h.want) {
			t.Errorf("unprepare of UID %q (%s/%s): error %q, want one containing %q", h.claim.Uid, h.claim.Namespace, h.claim.Name, e, h.want)
		}
	}
	after := readAll(t, watched...)
	for _, p := range watched {
		if !bytes.Equal(before[p], after[p]) {
			t.Errorf("%s changed by a hostile unprepare: %q, was %q", p, after[p], before[p])
		}
	}

	uresp, err := k.unprepare(ctx, b)
	if err != nil || uresp.Claims[string(b.UID)].GetError() != "" {
		t.Fatalf("kv-b's own unprepare: %v %+v", err, uresp)
	}
	if _, err := os.Stat(specPath(r.dir, b)); !os.IsNotExist(err) {
		t.Fatalf("kv-b's spec after its unprepare: %v", err)
	}
	if got := readAll(t, specPath(r.dir, a))[specPath(r.dir, a)]; !bytes.Equal(got, before[specPath(r.dir, a)]) {
		t.Fatal("kv-b's unprepare changed kv-a's spec")
	}
	mustPrepare(ctx, t, k, allocatedClaim(t, cs, "kv-c", dra.PoolName("gpu-node-a"), "channel-1"))
}

// TestOneCallPreparesAChannelForOneClaim: two claims of one NodePrepareResources call allocated the same
// channel: the first is prepared, the second refused naming the first, with no spec; a claim of another
// channel in the same call is prepared; once the first is unprepared the second is.
func TestOneCallPreparesAChannelForOneClaim(t *testing.T) {
	cs, ctx, r, k := oneNode(t)
	first := allocatedClaim(t, cs, "kv-first", dra.PoolName("gpu-node-a"), "channel-0")
	second := allocatedClaim(t, cs, "kv-second", dra.PoolName("gpu-node-a"), "channel-0")
	other := allocatedClaim(t, cs, "kv-other", dra.PoolName("gpu-node-a"), "channel-1")

	resp, err := k.prepare(ctx, first, second, other)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if e := resp.Claims[string(first.UID)].GetError(); e != "" {
		t.Fatalf("the first claim of channel-0: %q", e)
	}
	if e := resp.Claims[string(second.UID)].GetError(); !strings.Contains(e, "channel-0 is already prepared for claim default/kv-first") {
		t.Fatalf("the second claim of channel-0 in the same call: %q", e)
	}
	if e := resp.Claims[string(other.UID)].GetError(); e != "" {
		t.Fatalf("a claim of channel-1 in the same call: %q", e)
	}
	if _, err := os.Stat(specPath(r.dir, second)); !os.IsNotExist(err) {
		t.Fatalf("the refused claim got a CDI spec: %v", err)
	}
	for _, c := range []*resourceapi.ResourceClaim{first, other} {
		if _, err := os.Stat(specPath(r.dir, c)); err != nil {
			t.Fatalf("claim %s's CDI spec: %v", c.Name, err)
		}
	}

	if uresp, err := k.unprepare(ctx, first); err != nil || uresp.Claims[string(first.UID)].GetError() != "" {
		t.Fatalf("unpreparing the first claim: %v %+v", err, uresp)
	}
	mustPrepare(ctx, t, k, second)
}

// TestCDIDirectoryJunkCostsNoClaim: entries of the CDI directory named like a claim's spec that are none (a
// directory, a FIFO, a symbolic link, a file too large, one that is no JSON) are skipped: Prepare neither fails
// nor blocks on them, a real spec still holds its channel, and the entries are left alone.
func TestCDIDirectoryJunkCostsNoClaim(t *testing.T) {
	cs, ctx, r, k := oneNode(t)
	holder := allocatedClaim(t, cs, "kv-holder", dra.PoolName("gpu-node-a"), "channel-0")
	mustPrepare(ctx, t, k, holder)

	cdi := filepath.Join(r.dir, "cdi")
	// A spec that says channel-1 is held: counted if read through a link or past the size bound.
	claimsChannel1 := `{"cdiVersion":"0.6.0","kind":"fabricxfer.io/socket","annotations":{"fabricxfer.io/claim":"junk/junk","fabricxfer.io/devices":"channel-1"},"devices":[{"name":"junk","containerEdits":{}}]}`
	outside := filepath.Join(r.dir, "outside.json")
	if err := os.WriteFile(outside, []byte(claimsChannel1), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(cdi, "fabricxfer.io-fifo.json")
	t.Cleanup(func() {
		// Releases a reader blocked on the FIFO, so the driver can stop.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	junk := []struct {
		name string
		make func(path string) error
	}{
		{"fabricxfer.io-dir.json", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"fabricxfer.io-fifo.json", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"fabricxfer.io-link.json", func(p string) error { return os.Symlink(outside, p) }},
		{"fabricxfer.io-big.json", func(p string) error {
			return os.WriteFile(p, append([]byte(claimsChannel1), bytes.Repeat([]byte(" "), 64<<10)...), 0o644)
		}},
		{"fabricxfer.io-garbage.json", func(p string) error { return os.WriteFile(p, []byte("not json"), 0o644) }},
	}
	for i, j := range junk {
		if err := j.make(filepath.Join(cdi, j.name)); err != nil {
			t.Fatal(err)
		}
		callCtx, cancelCall := context.WithTimeout(ctx, 10*time.Second)
		taken := allocatedClaim(t, cs, fmt.Sprintf("kv-taken-%d", i), dra.PoolName("gpu-node-a"), "channel-0")
		free := allocatedClaim(t, cs, fmt.Sprintf("kv-free-%d", i), dra.PoolName("gpu-node-a"), "channel-1")
		resp, err := k.prepare(callCtx, taken, free)
		cancelCall()
		if err != nil {
			t.Fatalf("with %s in the CDI directory, NodePrepareResources failed: %v", j.name, err)
		}
		if e := resp.Claims[string(taken.UID)].GetError(); !strings.Contains(e, "already prepared for claim default/kv-holder") {
			t.Fatalf("with %s in the CDI directory, a claim of kv-holder's channel: %q", j.name, e)
		}
		if e := resp.Claims[string(free.UID)].GetError(); e != "" {
			t.Fatalf("with %s in the CDI directory, a claim of a free channel: %q", j.name, e)
		}
		if uresp, err := k.unprepare(ctx, free); err != nil || uresp.Claims[string(free.UID)].GetError() != "" {
			t.Fatalf("unpreparing %s: %v %+v", free.Name, err, uresp)
		}
	}
	for _, j := range junk {
		if _, err := os.Lstat(filepath.Join(cdi, j.name)); err != nil {
			t.Errorf("%s: %v", j.name, err)
		}
	}
	if uresp, err := k.unprepare(ctx, holder); err != nil || uresp.Claims[string(holder.UID)].GetError() != "" {
		t.Fatalf("unpreparing kv-holder: %v %+v", err, uresp)
	}
}

// vpodSlice is a node-less slice of the driver for pool with one vPOD device of domain.
func vpodSlice(pool, domain string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.VPodDRASliceName(pool)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: dra.DriverName, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1}, AllNodes: ptr.To(true),
			Devices: []resourceapi.Device{{Name: "vpod-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				dra.AttrType: {StringValue: ptr.To("vpod")}, dra.AttrVPod: {StringValue: ptr.To(domain)},
			}}},
		},
	}
}

// TestVPodClaimPreparedByTheVPodsDomain: a vPOD pool is judged by the domain its operator slice publishes, not
// by its name. A declared VPodTopology of any name is prepared on a node of its domain and refused elsewhere;
// one named as another domain's derived name is judged by its own domain; a pool nobody published, a device the
// pool lacks and a slice bound to a node or to all nodes are refused with the reason, and no vPOD claim gets a
// CDI spec.
func TestVPodClaimPreparedByTheVPodsDomain(t *testing.T) {
	env, cs := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	domains := map[string]string{"node-a1": testVPodA, "node-b1": testVPodB}
	plugins := map[string]kubelet{}
	dirs := map[string]string{}
	for node, dom := range domains {
		createNode(t, cs, node)
		r := startDriverWith(t, cs, node, &detector{rep: report(4, dom)}, 2, "/var/run/fabricxfer/kv-"+node)
		plugins[node], dirs[node] = dialPlugin(t, r.drv.PluginSocket()), r.dir
	}
	logger := testr.New(t)
	pub := &vpoddra.Publisher{Kube: cs, Metadata: metadata.NewForConfigOrDie(env.Config), Devices: 2, Log: &logger}
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Start(pubCtx) }()
	declared := func(name, domain, node string) v1alpha1.VPodTopology {
		return v1alpha1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VPodTopologySpec{
			Kind: "ualink", Domain: domain, Members: []v1alpha1.VPodMember{{Node: node}},
		}}
	}
	// The second takes the name vPOD A's discovered object would have, for vPOD B's domain.
	squatName := v1alpha1.DomainObjectName(testVPodA)
	pub.Update([]v1alpha1.VPodTopology{declared("rack-1-vpod-a", testVPodA, "node-a1"), declared(squatName, testVPodB, "node-b1")})
	eventually(t, "both vPOD slices", func() error {
		for _, name := range []string{"rack-1-vpod-a", squatName} {
			if _, err := cs.ResourceV1().ResourceSlices().Get(ctx, vpoddra.SliceName(name), metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	// Stopped, so it does not delete the node-less slice written next; its own slices stay.
	stopPub()
	if err := <-pubDone; err != nil {
		t.Fatalf("vPOD publisher: %v", err)
	}
	// Slices of an older operator carry the pool's old name, vpod-<x>, until the operator replaces them.
	oldNamed := vpodSlice(vpoddra.PoolName("old-operator"), testVPodA)
	oldNamed.Spec.Pool.Name, oldNamed.Spec.AllNodes = oldNamed.Name, nil
	oldNamed.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a1"}}}}}}
	for _, s := range []*resourceapi.ResourceSlice{vpodSlice(vpoddra.PoolName("all-nodes"), testVPodA), vpodSlice(vpoddra.PoolName("node-bound"), testVPodA), oldNamed} {
		if s.Name == vpoddra.SliceName("node-bound") {
			s.Spec.AllNodes, s.Spec.NodeName = nil, ptr.To("node-a1")
		}
		if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	group := allocatedClaim(t, cs, "group-a", vpoddra.PoolName("rack-1-vpod-a"), "vpod-0")
	squat := allocatedClaim(t, cs, "group-squat", vpoddra.PoolName(squatName), "vpod-0")
	cases := []struct {
		claim *resourceapi.ResourceClaim
		node  string
		want  string // "" when prepared
	}{
		{group, "node-a1", ""},
		{group, "node-b1", "is a vPOD this node is not in"},
		{squat, "node-b1", ""},
		{squat, "node-a1", "is a vPOD this node is not in"},
		{allocatedClaim(t, cs, "group-ghost", vpoddra.PoolName("nobody"), "vpod-0"), "node-a1", "no vPOD pool vpod/nobody is published"},
		// Allocated before the pools were renamed (vpod-<x>): read as vpod/<x>, judged by its domain all the same.
		{allocatedClaim(t, cs, "group-old-name", "vpod-rack-1-vpod-a", "vpod-0"), "node-a1", ""},
		{allocatedClaim(t, cs, "group-old-name-b", "vpod-rack-1-vpod-a", "vpod-0"), "node-b1", "is a vPOD this node is not in"},
		{allocatedClaim(t, cs, "group-old-ghost", "vpod-nobody", "vpod-0"), "node-a1", "no vPOD pool vpod/nobody is published"},
		{allocatedClaim(t, cs, "group-old-operator", "vpod-old-operator", "vpod-0"), "node-a1", ""},
		{allocatedClaim(t, cs, "group-old-operator-new-name", vpoddra.PoolName("old-operator"), "vpod-0"), "node-a1", ""},
		{allocatedClaim(t, cs, "group-no-device", vpoddra.PoolName("rack-1-vpod-a"), "vpod-9"), "node-a1", "has no device vpod-9"},
		{allocatedClaim(t, cs, "group-all-nodes", vpoddra.PoolName("all-nodes"), "vpod-0"), "node-a1", "not the operator's vPOD slice"},
		{allocatedClaim(t, cs, "group-node-bound", vpoddra.PoolName("node-bound"), "vpod-0"), "node-a1", "not the operator's vPOD slice"},
	}
	for _, c := range cases {
		resp, err := plugins[c.node].prepare(ctx, c.claim)
		if err != nil {
			t.Fatalf("%s preparing %s: %v", c.node, c.claim.Name, err)
		}
		got := resp.Claims[string(c.claim.UID)]
		switch {
		case c.want == "" && (got.GetError() != "" || len(got.GetDevices()) != 1 || len(got.Devices[0].CdiDeviceIds) != 0):
			t.Errorf("%s preparing %s: %+v, want its vPOD device with no CDI device", c.node, c.claim.Name, got)
		case c.want != "" && !strings.Contains(got.GetError(), c.want):
			t.Errorf("%s preparing %s: error %q, want one containing %q", c.node, c.claim.Name, got.GetError(), c.want)
		}
		if _, err := os.Stat(specPath(dirs[c.node], c.claim)); !os.IsNotExist(err) {
			t.Errorf("%s wrote a CDI spec for vPOD claim %s: %v", c.node, c.claim.Name, err)
		}
	}
}

// TestPrepareRefusesAClaimUIDThatIsNoUID: a claim whose UID is no Kubernetes UID (a path, upper case, empty) is
// refused with the reason and nothing is written for it, inside the CDI directory or beside it; a proper claim
// of the same call is prepared.
func TestPrepareRefusesAClaimUIDThatIsNoUID(t *testing.T) {
	dir := t.TempDir()
	drv, err := dra.New(dra.Config{
		NodeName: "gpu-node-a", HostSocketDir: "/var/run/fabricxfer/kv", CDIDir: filepath.Join(dir, "cdi"),
		Kube: fake.NewClientset(), Detect: (&detector{}).detect, Log: testr.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(uid, device string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kv-" + device, UID: types.UID(uid)},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "socket", Driver: dra.DriverName, Pool: dra.PoolName("gpu-node-a"), Device: device}},
			}}},
		}
	}
	good := claim("0d7c3b36-0000-4000-8000-000000000001", "channel-0")
	bad := []*resourceapi.ResourceClaim{claim("/../../escape", "channel-1"), claim("0D7C3B36-0000-4000-8000-000000000002", "channel-2"), claim("", "channel-3")}
	res, err := drv.Prepare(context.Background(), append([]*resourceapi.ResourceClaim{good}, bad...))
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if res[good.UID].Err != nil {
		t.Fatalf("a proper claim: %v", res[good.UID].Err)
	}
	for _, c := range bad {
		if e := res[c.UID].Err; e == nil || !strings.Contains(e.Error(), "is not a Kubernetes UID") {
			t.Errorf("claim UID %q: %v, want a refusal", c.UID, e)
		}
	}
	var written []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			written = append(written, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(written) != 1 || written[0] != filepath.Join(dir, "cdi", "fabricxfer.io-"+string(good.UID)+".json") {
		t.Fatalf("files written: %v, want the proper claim's spec only", written)
	}
}
