// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

const repoRoot = "../.."

// startAPIServer starts kube-apiserver and etcd from bin/ (make tools); resource.k8s.io/v1 is served by default.
func startAPIServer(t *testing.T) kubernetes.Interface {
	t.Helper()
	_, cs := startEnv(t)
	return cs
}

// startEnv is startAPIServer that also returns the environment, for kubeconfigs of other components.
func startEnv(t *testing.T) (*envtest.Environment, kubernetes.Interface) {
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
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env, cs
}

func createNode(t *testing.T, cs kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{corev1.LabelHostname: name}, // as the kubelet labels its Node
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// detector is a detection report a test can change while the driver runs.
type detector struct {
	mu  sync.Mutex
	rep topology.Report
}

func (d *detector) set(r topology.Report) { d.mu.Lock(); d.rep = r; d.mu.Unlock() }
func (d *detector) detect(context.Context) (topology.Report, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rep, nil
}

func report(gpus int, domain string) topology.Report {
	var r topology.Report
	for i := 0; i < gpus; i++ {
		g := topology.GPU{Index: i, Vendor: "amd"}
		if domain != "" {
			g.Fabric = &topology.Fabric{Kind: "ualink", Domain: domain}
		}
		r.GPUs = append(r.GPUs, g)
	}
	r.Engines = []topology.Engine{{Name: "xgmi", Available: true}, {Name: "fabric", Available: domain != ""}, {Name: "rdma", Available: false}, {Name: "tcp", Available: true}}
	return r
}

type running struct {
	drv  *dra.Driver
	dir  string
	done chan struct{}
	err  error
	stop context.CancelFunc
}

// wait stops the driver and returns what Run returned.
func (r *running) wait() error {
	r.stop()
	<-r.done
	return r.err
}

// startDriver runs a node's driver as the agent does, with its kubelet directories in a scratch folder.
func startDriver(t *testing.T, cs kubernetes.Interface, node string, det *detector, channels int) *running {
	t.Helper()
	return startDriverWith(t, cs, node, det, channels, "/var/run/fabricxfer/kv")
}

func startDriverWith(t *testing.T, cs kubernetes.Interface, node string, det *detector, channels int, hostSocketDir string, tune ...func(*dra.Config)) *running {
	t.Helper()
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := dra.Config{
		NodeName: node, PoolNamespace: "inference", PoolName: "kv",
		HostSocketDir: hostSocketDir, Channels: channels,
		CDIDir: filepath.Join(dir, "cdi"), PluginDir: filepath.Join(dir, "plugin"), RegistryDir: filepath.Join(dir, "registry"),
		Kube: cs, Detect: det.detect, Period: 100 * time.Millisecond, Log: logr.Discard(),
	}
	for _, f := range tune {
		f(&cfg)
	}
	drv, err := dra.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{drv: drv, dir: dir, done: make(chan struct{}), stop: cancel}
	go func() { r.err = drv.Run(ctx); close(r.done) }()
	t.Cleanup(func() { _ = r.wait() })
	select {
	case <-drv.Ready():
	case <-r.done:
		t.Fatalf("driver stopped at start: %v", r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("driver not ready after 30 s")
	}
	return r
}

func slicesOf(t *testing.T, cs kubernetes.Interface, node string) []resourceapi.ResourceSlice {
	t.Helper()
	sel := fields.Set{resourceapi.ResourceSliceSelectorDriver: dra.DriverName, resourceapi.ResourceSliceSelectorNodeName: node}.AsSelector().String()
	l, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
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
		time.Sleep(100 * time.Millisecond)
	}
}

func str(d resourceapi.Device, name string) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return "<unset>"
}

func num(d resourceapi.Device, name string) int64 {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return *a.IntValue
	}
	return -1
}

func flag(d resourceapi.Device, name string) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.BoolValue != nil {
		if *a.BoolValue {
			return "true"
		}
		return "false"
	}
	return "<unset>"
}

// TestSlicesPerAgentFollowDetectionAndGoWithTheAgent: every agent of a pool publishes one ResourceSlice on the
// real API server, owned by its Node, with the pool, node, vPOD, engine and GPU attributes; a changed fabric
// domain or GPU count reaches the slice; an agent that stops takes its slice away.
func TestSlicesPerAgentFollowDetectionAndGoWithTheAgent(t *testing.T) {
	cs := startAPIServer(t)
	const domA, domB = "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1", "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/2"
	nodes := map[string]*corev1.Node{"gpu-node-a": createNode(t, cs, "gpu-node-a"), "rdma-node-c": createNode(t, cs, "rdma-node-c")}
	detA, detC := &detector{rep: report(4, domA)}, &detector{rep: report(0, "")}
	a := startDriver(t, cs, "gpu-node-a", detA, 8)
	startDriver(t, cs, "rdma-node-c", detC, 8)

	check := func(node string, gpus int64, vpod, fabric string) error {
		s := slicesOf(t, cs, node)
		if len(s) != 1 {
			return fmt.Errorf("want one slice, have %d", len(s))
		}
		sl := s[0]
		if sl.Spec.NodeName == nil || *sl.Spec.NodeName != node || sl.Spec.Pool.Name != dra.PoolName(node) || sl.Spec.Driver != dra.DriverName {
			return fmt.Errorf("slice spec names another node, pool or driver: %+v", sl.Spec)
		}
		if len(sl.OwnerReferences) != 1 || sl.OwnerReferences[0].Kind != "Node" || sl.OwnerReferences[0].UID != nodes[node].UID {
			return fmt.Errorf("slice owners %+v, want Node %s", sl.OwnerReferences, nodes[node].UID)
		}
		if len(sl.Spec.Devices) != 8 {
			return fmt.Errorf("%d devices, want 8", len(sl.Spec.Devices))
		}
		for i, d := range sl.Spec.Devices {
			if d.Name != dra.DeviceName(i) || num(d, dra.AttrChannel) != int64(i) {
				return fmt.Errorf("device %d is %s", i, d.Name)
			}
			if str(d, dra.AttrPool) != "kv" || str(d, dra.AttrPoolNamespace) != "inference" || str(d, dra.AttrNode) != node {
				return fmt.Errorf("pool/node attributes of %s: %v", d.Name, d.Attributes)
			}
			if num(d, dra.AttrGPUCount) != gpus || str(d, dra.AttrVPod) != vpod || flag(d, "fabric") != fabric || flag(d, "xgmi") != "true" || flag(d, "rdma") != "false" {
				return fmt.Errorf("detection attributes of %s: gpus %d vpod %s fabric %s", d.Name, num(d, dra.AttrGPUCount), str(d, dra.AttrVPod), flag(d, "fabric"))
			}
			wantName := ""
			if vpod != "" {
				wantName = v1alpha1.DomainObjectName(vpod)
			}
			if str(d, dra.AttrVPodName) != wantName {
				return fmt.Errorf("vpodName %s", str(d, dra.AttrVPodName))
			}
		}
		return nil
	}
	eventually(t, "gpu-node-a's slice", func() error { return check("gpu-node-a", 4, domA, "true") })
	eventually(t, "rdma-node-c's slice", func() error { return check("rdma-node-c", 0, "", "false") })

	detA.set(report(8, domB))
	eventually(t, "gpu-node-a's slice after its domain and GPUs changed", func() error { return check("gpu-node-a", 8, domB, "true") })

	if err := a.wait(); err != nil {
		t.Fatalf("Run after stop: %v", err)
	}
	if s := slicesOf(t, cs, "gpu-node-a"); len(s) != 0 {
		t.Fatalf("a stopped agent left %d slices", len(s))
	}
	if s := slicesOf(t, cs, "rdma-node-c"); len(s) != 1 {
		t.Fatalf("stopping one agent changed another node's slices: %d", len(s))
	}
}

// kubelet calls the plugin the way the kubelet does: gRPC over the plugin's Unix socket.
type kubelet struct{ c drapb.DRAPluginClient }

func dialPlugin(t *testing.T, sock string) kubelet {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return kubelet{drapb.NewDRAPluginClient(conn)}
}

func (k kubelet) prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (*drapb.NodePrepareResourcesResponse, error) {
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return k.c.NodePrepareResources(ctx, req)
}

func (k kubelet) unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (*drapb.NodeUnprepareResourcesResponse, error) {
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return k.c.NodeUnprepareResources(ctx, req)
}

// allocatedClaim creates a claim for one device of the fabricxfer.io class and writes the allocation the
// scheduler would: device pool/device.
func allocatedClaim(t *testing.T, cs kubernetes.Interface, name, pool, device string) *resourceapi.ResourceClaim {
	t.Helper()
	return allocatedClaimIn(t, cs, "default", name, pool, device)
}

// allocatedClaimIn is allocatedClaim in namespace ns, which it creates when missing.
func allocatedClaimIn(t *testing.T, cs kubernetes.Interface, ns, name, pool, device string) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c, err := cs.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "socket", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "socket", Driver: dra.DriverName, Pool: pool, Device: device,
	}}}}
	c, err = cs.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocating claim %s: %v", name, err)
	}
	return c
}

// oneNode starts an API server with node gpu-node-a, runs its driver of four channels (tune changes its
// config) and dials the driver's kubelet socket; ctx ends with the test, within a minute.
func oneNode(t *testing.T, tune ...func(*dra.Config)) (kubernetes.Interface, context.Context, *running, kubelet) {
	t.Helper()
	cs := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	createNode(t, cs, "gpu-node-a")
	r := startDriverWith(t, cs, "gpu-node-a", &detector{rep: report(4, "ualink:p/1")}, 4, "/var/run/fabricxfer/kv", tune...)
	return cs, ctx, r, dialPlugin(t, r.drv.PluginSocket())
}

// TestPrepareRefusesANamespaceThePoolDoesNotAdmit: a claim of a channel from a namespace the pool does not admit
// gets no spec (its pods could not use the socket, and it would hold the node's channel); an admitted
// namespace's claim of the same channel is prepared.
func TestPrepareRefusesANamespaceThePoolDoesNotAdmit(t *testing.T) {
	cs, ctx, r, k := oneNode(t, func(c *dra.Config) {
		c.AdmitNamespace = func(_ context.Context, ns string) error {
			if ns != "default" {
				return fmt.Errorf("namespace %s may not use pool inference/kv", ns)
			}
			return nil
		}
	})
	outsider := allocatedClaimIn(t, cs, "team-x", "kv-x", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err := k.prepare(ctx, outsider)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Claims[string(outsider.UID)].GetError(); !strings.Contains(e, "may not use pool inference/kv") {
		t.Fatalf("a claim of a namespace the pool does not admit: %q, want refused", e)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "cdi", "fabricxfer.io-"+string(outsider.UID)+".json")); !os.IsNotExist(err) {
		t.Fatalf("the refused claim got a CDI spec: %v", err)
	}
	admitted := allocatedClaim(t, cs, "kv-a", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err = k.prepare(ctx, admitted)
	if err != nil || resp.Claims[string(admitted.UID)].GetError() != "" {
		t.Fatalf("an admitted namespace's claim of the channel: %v %+v", err, resp)
	}
}

// TestAClaimGoneWithoutUnprepareFreesItsChannel: a prepared claim deleted from the API server without an
// Unprepare (the kubelet's state lost) held its channel for good, while the scheduler kept allocating it. The
// next claim of that channel finds the holder gone, its spec is dropped, and the new claim is prepared; a holder
// that still exists still holds.
func TestAClaimGoneWithoutUnprepareFreesItsChannel(t *testing.T) {
	cs, ctx, r, k := oneNode(t)
	gone := allocatedClaim(t, cs, "kv-gone", dra.PoolName("gpu-node-a"), "channel-0")
	kept := allocatedClaim(t, cs, "kv-kept", dra.PoolName("gpu-node-a"), "channel-1")
	for _, c := range []*resourceapi.ResourceClaim{gone, kept} {
		if resp, err := k.prepare(ctx, c); err != nil || resp.Claims[string(c.UID)].GetError() != "" {
			t.Fatalf("preparing %s: %v %+v", c.Name, err, resp)
		}
	}
	if err := cs.ResourceV1().ResourceClaims("default").Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := allocatedClaim(t, cs, "kv-next", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err := k.prepare(ctx, next)
	if err != nil || resp.Claims[string(next.UID)].GetError() != "" {
		t.Fatalf("a claim of the channel a deleted claim held: %v %+v", err, resp)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "cdi", "fabricxfer.io-"+string(gone.UID)+".json")); !os.IsNotExist(err) {
		t.Fatalf("the deleted claim's spec is still there: %v", err)
	}
	other := allocatedClaim(t, cs, "kv-other", dra.PoolName("gpu-node-a"), "channel-1")
	resp, err = k.prepare(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Claims[string(other.UID)].GetError(); !strings.Contains(e, "already prepared for claim default/kv-kept") {
		t.Fatalf("a claim of a channel an existing claim holds: %q, want refused", e)
	}
}

// TestPrepareOverTheKubeletSocket: NodePrepareResources over the plugin's socket writes a CDI spec that mounts
// the pool's socket directory and sets FABRICXFER_SOCKET, and answers its CDI device; preparing again is the
// same; an unknown claim, a claim of another node's device and a claim of a device another claim holds are
// refused; NodeUnprepareResources removes the spec, twice without error, and frees the device.
func TestPrepareOverTheKubeletSocket(t *testing.T) {
	cs, ctx, r, k := oneNode(t)

	mine := allocatedClaim(t, cs, "kv-a", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err := k.prepare(ctx, mine)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	got := resp.Claims[string(mine.UID)]
	if got == nil || got.Error != "" || len(got.Devices) != 1 {
		t.Fatalf("prepare answer %+v", resp.Claims)
	}
	d := got.Devices[0]
	if d.PoolName != "gpu-node-a" || d.DeviceName != "channel-0" || len(d.RequestNames) != 1 || d.RequestNames[0] != "socket" ||
		len(d.CdiDeviceIds) != 1 || d.CdiDeviceIds[0] != "fabricxfer.io/socket="+string(mine.UID) {
		t.Fatalf("prepared device %+v", d)
	}
	specPath := filepath.Join(r.dir, "cdi", "fabricxfer.io-"+string(mine.UID)+".json")
	b, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatalf("the CDI spec: %v", err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("the CDI spec is not CDI JSON: %v\n%s", err, b)
	}
	if spec.Kind != "fabricxfer.io/socket" || len(spec.Devices) != 1 || spec.Devices[0].Name != string(mine.UID) {
		t.Fatalf("CDI spec kind/devices: %s", b)
	}
	edits := spec.Devices[0].ContainerEdits
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != "/var/run/fabricxfer/kv" || edits.Mounts[0].ContainerPath != "/run/fabricxfer" {
		t.Fatalf("CDI mounts: %s", b)
	}
	if len(edits.Env) != 1 || edits.Env[0] != "FABRICXFER_SOCKET=/run/fabricxfer/agent.sock" {
		t.Fatalf("CDI env: %s", b)
	}
	if resp, err := k.prepare(ctx, mine); err != nil || resp.Claims[string(mine.UID)].GetError() != "" {
		t.Fatalf("preparing again: %v %+v", err, resp)
	}

	unknown := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nobody", UID: "0d7c3b36-0000-4000-8000-000000000000"}}
	if _, err := k.prepare(ctx, unknown); err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("an unknown claim: %v, want an error naming it", err)
	}
	foreign := allocatedClaim(t, cs, "kv-elsewhere", dra.PoolName("gpu-node-b"), "channel-0")
	resp, err = k.prepare(ctx, foreign)
	if err != nil {
		t.Fatalf("NodePrepareResources (foreign): %v", err)
	}
	if e := resp.Claims[string(foreign.UID)].GetError(); !strings.Contains(e, "not this node's") {
		t.Fatalf("a claim of another node's device: %q", e)
	}
	second := allocatedClaim(t, cs, "kv-b", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err = k.prepare(ctx, second)
	if err != nil {
		t.Fatalf("NodePrepareResources (second): %v", err)
	}
	if e := resp.Claims[string(second.UID)].GetError(); !strings.Contains(e, "already prepared for claim default/kv-a") {
		t.Fatalf("a second claim of a held device: %q", e)
	}
	// Another namespace's claim of the held device is refused without the holder's name (it reaches the
	// refused pod's events).
	elsewhere := allocatedClaimIn(t, cs, "team-b", "kv-c", dra.PoolName("gpu-node-a"), "channel-0")
	resp, err = k.prepare(ctx, elsewhere)
	if err != nil {
		t.Fatalf("NodePrepareResources (another namespace): %v", err)
	}
	if e := resp.Claims[string(elsewhere.UID)].GetError(); !strings.Contains(e, "already prepared for a claim of another namespace") || strings.Contains(e, "kv-a") {
		t.Fatalf("another namespace's claim of a held device: %q, want refused without the holder's name", e)
	}
	for _, c := range []*resourceapi.ResourceClaim{foreign, second, elsewhere} {
		if _, err := os.Stat(filepath.Join(r.dir, "cdi", "fabricxfer.io-"+string(c.UID)+".json")); !os.IsNotExist(err) {
			t.Fatalf("a refused claim got a CDI spec: %v", err)
		}
	}

	for i := 0; i < 2; i++ {
		uresp, err := k.unprepare(ctx, mine)
		if err != nil || uresp.Claims[string(mine.UID)].GetError() != "" {
			t.Fatalf("NodeUnprepareResources #%d: %v %+v", i+1, err, uresp)
		}
	}
	if _, err := os.Stat(specPath); !os.IsNotExist(err) {
		t.Fatalf("the CDI spec after unprepare: %v", err)
	}
	resp, err = k.prepare(ctx, second)
	if err != nil || resp.Claims[string(second.UID)].GetError() != "" {
		t.Fatalf("the second claim once the device is free: %v %+v", err, resp)
	}
}
