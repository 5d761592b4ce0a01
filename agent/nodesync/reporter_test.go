// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

const repoRoot = "../.."

// startAPIServer starts kube-apiserver and etcd from bin/ and installs the named CRD files of
// config/crd/bases, or all of them when none are named.
func startAPIServer(t *testing.T, crdFiles ...string) client.Client {
	t.Helper()
	return startAPIServerWith(t, false, crdFiles...)
}

// startAPIServerWith is startAPIServer; with skipBrokenCRDs, CRDs that the API server refuses skip the test
// instead of failing it (for tests whose subject needs CRDs that this package does not write).
func startAPIServerWith(t *testing.T, skipBrokenCRDs bool, crdFiles ...string) client.Client {
	t.Helper()
	_, c := startEnv(t, skipBrokenCRDs, crdFiles...)
	return c
}

// startEnv is startAPIServerWith that also returns the REST config, for clients of the test's own.
func startEnv(t *testing.T, skipBrokenCRDs bool, crdFiles ...string) (*rest.Config, client.Client) {
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
	crds := []string{filepath.Join(repoRoot, "config", "crd", "bases")}
	if len(crdFiles) > 0 {
		crds = nil
		for _, f := range crdFiles {
			crds = append(crds, filepath.Join(repoRoot, "config", "crd", "bases", f))
		}
	}
	if dir := os.Getenv("FABRICXFER_TEST_CRDS"); dir != "" {
		crds = []string{dir} // a patched copy, to try a CRD change before it is generated
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	cfg, err := env.Start()
	if err != nil {
		if skipBrokenCRDs && strings.Contains(err.Error(), "unable to install CRDs") {
			t.Skipf("the API server refuses a CRD of config/crd/bases: %v", err)
		}
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c
}

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// copyTree copies a fixture tree, symlinks as symlinks, so a test can change it.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		}
	})
	if err != nil {
		t.Fatalf("copying fixture: %v", err)
	}
	return dst
}

// waitFor polls until cond holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() (bool, error)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return time.Since(start)
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s (last error: %v)", what, within, lastErr)
	return 0
}

// fixtureNode creates the Node name and the namespace "inference", and returns the Node, a host of a copy of
// the mi300x-8gpu-roce fixture tree and the copy's root (the test may change it).
func fixtureNode(ctx context.Context, t *testing.T, c client.Client, name string) (*corev1.Node, topology.Host, string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatalf("creating Node: %v", err)
	}
	createNamespace(t, c, "inference")
	root := copyTree(t, filepath.Join(repoRoot, "topology", "testdata", "mi300x-8gpu-roce"))
	host, err := topology.NewDirHost(root)
	if err != nil {
		t.Fatal(err)
	}
	return node, host, root
}

// transferNodeCRD is the one CRD an agent writes.
const transferNodeCRD = "fabricxfer.io_transfernodes.yaml"

func TestReporterWritesTransferNode(t *testing.T) {
	c := startAPIServer(t, transferNodeCRD)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	node, host, root := fixtureNode(ctx, t, c, "mi300x-a")
	const period = 2 * time.Second
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, PoolNamespace: "inference", PoolName: "kv",
		Period:   period,
		Identity: nodestatus.Identity{AgentVersion: "test", Endpoint: "10.0.0.1:7470"},
		Detect: func(ctx context.Context) (topology.Report, error) {
			return topology.Detect(ctx, host, topology.Options{})
		},
		Client:   c,
		Log:      testr.New(t),
		Decorate: func(st *v1alpha1.TransferNodeStatus) { st.RegisteredBytes = 1 << 30 },
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	var tn v1alpha1.TransferNode
	get := func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: node.Name}, &tn)
		return err == nil && tn.Status.LastHeartbeat != nil, err
	}
	waitFor(t, 10*time.Second, "TransferNode with a heartbeat", get)

	if len(tn.OwnerReferences) != 1 || tn.OwnerReferences[0].Kind != "Node" || tn.OwnerReferences[0].UID != node.UID {
		t.Errorf("owner references %+v, want the Node %s (%s)", tn.OwnerReferences, node.Name, node.UID)
	}
	if tn.Spec.NodeName != node.Name || tn.Spec.PoolName != "kv" || tn.Labels[v1alpha1.LabelPoolName] != "kv" ||
		tn.Labels[v1alpha1.LabelPoolNamespace] != "inference" {
		t.Errorf("spec %+v labels %v", tn.Spec, tn.Labels)
	}
	st := tn.Status
	if len(st.GPUs) != 8 || len(st.NICs) != 8 || st.NICs[3].State != "ACTIVE" || st.Endpoint != "10.0.0.1:7470" ||
		st.AgentVersion != "test" || st.GPUDirect == nil || !st.GPUDirect.PeerMem || st.RegisteredBytes != 1<<30 {
		t.Errorf("status %+v", st)
	}
	managers := map[string]bool{}
	for _, mf := range tn.ManagedFields {
		managers[mf.Manager+"/"+mf.Subresource] = mf.Operation == metav1.ManagedFieldsOperationApply
	}
	if !managers["fabricxfer-agent/"] || !managers["fabricxfer-agent/status"] {
		t.Errorf("managed fields %v: want server-side apply by fabricxfer-agent of the object and its status", managers)
	}

	// The heartbeat is the pool's Lease for this node, owned by the report; the report stays as written.
	var lease coordinationv1.Lease
	leaseKey := client.ObjectKey{Namespace: "inference", Name: nodesync.LeaseName("kv", node.Name)}
	waitFor(t, 5*time.Second, "heartbeat Lease", func() (bool, error) {
		err := c.Get(ctx, leaseKey, &lease)
		return err == nil, err
	})
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != node.Name || lease.Spec.LeaseDurationSeconds == nil ||
		*lease.Spec.LeaseDurationSeconds != 6 || lease.Labels[v1alpha1.LabelPoolName] != "kv" ||
		lease.Labels[v1alpha1.LabelPoolNamespace] != "inference" {
		t.Errorf("lease holder %v duration %v labels %v, want the node, 3 periods (6 s) and the pool", lease.Spec.HolderIdentity,
			lease.Spec.LeaseDurationSeconds, lease.Labels)
	}
	if refs := lease.OwnerReferences; len(refs) != 1 || refs[0].Kind != "TransferNode" || refs[0].UID != tn.UID {
		t.Errorf("lease owner references %+v, want the TransferNode %s", refs, tn.UID)
	}
	firstRenew, reportVersion := lease.Spec.RenewTime.Time, tn.ResourceVersion
	waitFor(t, 3*period, "lease renewal", func() (bool, error) {
		err := c.Get(ctx, leaseKey, &lease)
		return err == nil && lease.Spec.RenewTime.After(firstRenew), err
	})
	if _, err := get(); err != nil || tn.ResourceVersion != reportVersion {
		t.Errorf("TransferNode resourceVersion %s -> %s (%v) while nothing changed; want it untouched", reportVersion, tn.ResourceVersion, err)
	}
	first := tn.Status.LastHeartbeat.Time

	// A NIC goes down on the node: the report shows it within one period (plus the API round trip).
	state := filepath.Join(root, "sys", "class", "infiniband", "mlx5_3", "ports", "1", "state")
	if err := os.WriteFile(state, []byte("1: DOWN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, period+2*time.Second, "NIC down reported", func() (bool, error) {
		ok, err := get()
		return ok && tn.Status.NICs[3].State == "DOWN", err
	})
	t.Logf("NIC down reported after %s (period %s)", took.Round(time.Millisecond), period)
	if !tn.Status.LastHeartbeat.After(first) {
		t.Errorf("lastHeartbeat %s not after %s: a rewritten status says when it was written", tn.Status.LastHeartbeat, first)
	}
	for _, e := range tn.Status.Engines {
		if e.Name == v1alpha1.EngineRDMA && (!e.Available || !strings.HasPrefix(e.Reason, "7 of 8 ports usable (mlx5_3/1 DOWN)")) {
			t.Errorf("rdma engine %+v", e)
		}
	}

	// A TransferNode deleted under the agent (its Node recreated, an admin cleaning up) is written again. Its
	// Lease goes with it by garbage collection, which this control plane lacks: the test deletes it too.
	if err := c.Delete(ctx, &v1alpha1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}); err != nil {
		t.Fatalf("deleting the TransferNode: %v", err)
	}
	if err := c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: leaseKey.Namespace, Name: leaseKey.Name}}); err != nil {
		t.Fatalf("deleting the Lease: %v", err)
	}
	oldUID := tn.UID
	waitFor(t, 3*period+2*time.Second, "TransferNode written again after deletion", func() (bool, error) {
		ok, err := get()
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return ok && tn.UID != oldUID && tn.Spec.NodeName == node.Name && len(tn.OwnerReferences) == 1, err
	})
	waitFor(t, 3*period, "Lease owned by the new TransferNode", func() (bool, error) {
		err := c.Get(ctx, leaseKey, &lease)
		return err == nil && len(lease.OwnerReferences) == 1 && lease.OwnerReferences[0].UID == tn.UID, err
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Run did not return within 5s of cancel")
	}
}

// A kick reports at once what Decorate adds, rather than a period later: the engines an agent runs reach the
// report (and the pool's counts) as soon as they are assembled, not a heartbeat after the first report.
func TestReporterReportsAtOnceWhenKicked(t *testing.T) {
	c := startAPIServer(t, transferNodeCRD)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	node, host, _ := fixtureNode(ctx, t, c, "mi300x-a")
	var running atomic.Bool
	kick := make(chan struct{}, 1)
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, Period: time.Hour, Client: c, Log: testr.New(t),
		Detect: func(ctx context.Context) (topology.Report, error) {
			return topology.Detect(ctx, host, topology.Options{})
		},
		Decorate: func(st *v1alpha1.TransferNodeStatus) {
			for i := range st.Engines {
				v := running.Load() && st.Engines[i].Available // the API refuses a running engine detection does not allow
				st.Engines[i].Running = &v
			}
		},
		Kick: kick,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var tn v1alpha1.TransferNode
	runs := func(want bool) func() (bool, error) {
		return func() (bool, error) {
			err := c.Get(ctx, client.ObjectKey{Name: node.Name}, &tn)
			return err == nil && len(tn.Status.Engines) > 0 && tn.Status.Engines[0].Available && tn.Status.Engines[0].Running != nil &&
				*tn.Status.Engines[0].Running == want, err
		}
	}
	waitFor(t, 10*time.Second, "the first report, saying no engine runs", runs(false))
	running.Store(true)
	kick <- struct{}{}
	waitFor(t, 10*time.Second, "the kicked report, saying the engines run (the period is an hour)", runs(true))
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v after cancel", err)
	}
}

// A kick that comes while rounds fail (the engines assembled during a slow first round against an overloaded
// API server) leaves the retry to the backoff: a thousand agents retrying at once is what the backoff prevents.
func TestAKickKeepsTheBackoffOfAFailedRound(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errors.New("API server overloaded")
		}}).Build()
	kick := make(chan struct{}, 1)
	var rounds atomic.Int32
	r, err := nodesync.New(nodesync.Config{
		NodeName: "n", Period: time.Hour, Client: c, Log: testr.New(t),
		Detect: func(context.Context) (topology.Report, error) {
			if rounds.Load() == 0 {
				select { // assembled during the first, failing, round
				case kick <- struct{}{}:
				default:
				}
			}
			return topology.Report{}, nil
		},
		Kick:       kick,
		AfterRound: func(error) { rounds.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-done
	if n := rounds.Load(); n != 1 {
		t.Errorf("%d rounds in 2 s after a failed one (the retry is due in 30 to 90 minutes), want 1", n)
	}
}

func TestReporterNeedsItsNode(t *testing.T) {
	c := startAPIServer(t, transferNodeCRD)
	r, err := nodesync.New(nodesync.Config{
		NodeName: "no-such-node", Period: time.Second, Client: c, Log: testr.New(t),
		Detect: func(context.Context) (topology.Report, error) { return topology.Report{}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	err = r.ReportOnce(t.Context())
	if err == nil || !strings.Contains(err.Error(), "reading Node no-such-node") {
		t.Fatalf("ReportOnce = %v, want an error about the missing Node", err)
	}
	var list v1alpha1.TransferNodeList
	if err := c.List(t.Context(), &list); err != nil || len(list.Items) != 0 {
		t.Errorf("TransferNodes after failure: %d (%v), want none", len(list.Items), err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	detect := func(context.Context) (topology.Report, error) { return topology.Report{}, nil }
	for name, cfg := range map[string]nodesync.Config{
		"no node":     {Period: time.Second, Detect: detect},
		"zero period": {NodeName: "n", Detect: detect},
		"no detector": {NodeName: "n", Period: time.Second},
	} {
		if _, err := nodesync.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// createNamespace creates the pool's namespace, where agents keep their heartbeat Leases.
func createNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// slowClient delays every request by the current value of delay, as an overloaded API server answers.
func slowClient(t *testing.T, cfg *rest.Config, delay *atomic.Int64) client.WithWatch {
	t.Helper()
	inner, err := client.NewWithWatch(cfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(ctx context.Context) error {
		select {
		case <-time.After(time.Duration(delay.Load())):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return interceptor.NewClient(inner, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if err := wait(ctx); err != nil {
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
}

// The first round, which writes the most, may take up to the heartbeat timeout on a slow API server instead of
// failing at one period and sending it all again; once a round succeeded, rounds are bounded by the period.
func TestReporterFirstRoundOutlastsThePeriod(t *testing.T) {
	cfg, c := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	node, host, _ := fixtureNode(ctx, t, c, "slow-api")
	const period = 600 * time.Millisecond
	var delay atomic.Int64
	delay.Store(int64(250 * time.Millisecond)) // four or five requests: about two periods, under three
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, PoolNamespace: "inference", PoolName: "kv", Period: period,
		Identity: nodestatus.Identity{AgentVersion: "test", Endpoint: "10.0.0.1:7470"},
		Detect: func(ctx context.Context) (topology.Report, error) {
			return topology.Detect(ctx, host, topology.Options{})
		},
		Client: slowClient(t, cfg, &delay), Log: testr.New(t), RecordEvents: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := r.ReportOnce(ctx); err != nil {
		t.Fatalf("first round on a slow API server: %v", err)
	}
	if took := time.Since(start); took <= period {
		t.Fatalf("the first round took %v, not longer than a period (%v): the test did not slow it down", took, period)
	}
	var tn v1alpha1.TransferNode
	if err := c.Get(ctx, client.ObjectKey{Name: node.Name}, &tn); err != nil || tn.Status.LastHeartbeat == nil {
		t.Fatalf("TransferNode after the first round: %v, heartbeat %v", err, tn.Status.LastHeartbeat)
	}
	// Steady state: a round (one Lease renewal) slower than the period fails at the period.
	delay.Store(int64(period + 200*time.Millisecond))
	start = time.Now()
	if err := r.ReportOnce(ctx); err == nil {
		t.Fatal("a steady-state round slower than the period succeeded")
	}
	if took := time.Since(start); took > period+150*time.Millisecond {
		t.Fatalf("a steady-state round took %v, bounded by the period (%v)", took, period)
	}
}
