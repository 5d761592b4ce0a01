package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

const settle = 20 * time.Second

func newNamespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fx-test-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// newNodes creates n Node objects labelled group=<group> and removes them when the test ends.
func newNodes(t *testing.T, c client.Client, group string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("%s-node-%d", group, i),
			Labels: map[string]string{"fabricxfer.io/test-group": group},
		}}
		if err := c.Create(context.Background(), node); err != nil {
			t.Fatalf("creating node: %v", err)
		}
		names = append(names, node.Name)
		t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
	}
	return names
}

func newPool(t *testing.T, c client.Client, ns, name, group string) *fxv1.TransferPool {
	t.Helper()
	pool := &fxv1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fxv1.TransferPoolSpec{
			NodeSelector: map[string]string{"fabricxfer.io/test-group": group},
			Tolerations:  []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	if err := c.Create(context.Background(), pool); err != nil {
		t.Fatalf("creating pool: %v", err)
	}
	return pool
}

// report writes a TransferNode for node as the agent would, with a heartbeat at the given time.
func report(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string, heartbeat time.Time, gpus []fxv1.GPU, engines ...fxv1.EngineName) {
	t.Helper()
	ctx := context.Background()
	tn := &fxv1.TransferNode{}
	err := c.Get(ctx, client.ObjectKey{Name: node}, tn)
	if apierrors.IsNotFound(err) {
		tn = &fxv1.TransferNode{
			ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec:       fxv1.TransferNodeSpec{NodeName: node, PoolNamespace: pool.Namespace, PoolName: pool.Name},
		}
		if err := c.Create(ctx, tn); err != nil {
			t.Fatalf("creating transfer node %s: %v", node, err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), tn) })
	} else if err != nil {
		t.Fatalf("reading transfer node %s: %v", node, err)
	}
	tn.Status.LastHeartbeat = &metav1.Time{Time: heartbeat}
	tn.Status.GPUs = gpus
	tn.Status.Engines = nil
	for _, e := range fxv1.AllEngines {
		avail := false
		for _, want := range engines {
			avail = avail || want == e
		}
		tn.Status.Engines = append(tn.Status.Engines, fxv1.EngineAvailability{Name: e, Available: avail, Reason: "test"})
	}
	if err := c.Status().Update(ctx, tn); err != nil {
		t.Fatalf("writing status of transfer node %s: %v", node, err)
	}
}

func getPool(c client.Client, pool *fxv1.TransferPool) (*fxv1.TransferPool, error) {
	got := &fxv1.TransferPool{}
	return got, c.Get(context.Background(), client.ObjectKeyFromObject(pool), got)
}

// poolCondition waits for the pool's Ready condition to have the given status and reason and the node counts.
func waitPool(t *testing.T, c client.Client, pool *fxv1.TransferPool, ready metav1.ConditionStatus, reason string, nodes string) *fxv1.TransferPool {
	t.Helper()
	var got *fxv1.TransferPool
	eventually(t, settle, fmt.Sprintf("pool %s Ready=%s/%s nodes %s", pool.Name, ready, reason, nodes), func() error {
		var err error
		if got, err = getPool(c, pool); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
		if cond == nil {
			return fmt.Errorf("no Ready condition yet")
		}
		if cond.Status != ready || cond.Reason != reason || got.Status.Nodes != nodes {
			return fmt.Errorf("Ready=%s/%s nodes=%s (%s)", cond.Status, cond.Reason, got.Status.Nodes, cond.Message)
		}
		if cond.ObservedGeneration != got.Generation || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
		}
		return nil
	})
	return got
}

func TestPoolOwnsAgentDaemonSetAndRBAC(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "owns")

	ds := &appsv1.DaemonSet{}
	eventually(t, settle, "agent DaemonSet", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fabricxfer-agent-kv"}, ds)
	})
	if got := ds.Spec.Template.Spec.NodeSelector["fabricxfer.io/test-group"]; got != "owns" {
		t.Errorf("DaemonSet node selector = %v, want the pool's", ds.Spec.Template.Spec.NodeSelector)
	}
	if len(ds.Spec.Template.Spec.Tolerations) != 1 || ds.Spec.Template.Spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("DaemonSet tolerations = %v, want the pool's", ds.Spec.Template.Spec.Tolerations)
	}
	for _, obj := range []client.Object{ds, &corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		key := client.ObjectKey{Namespace: ns, Name: "fabricxfer-agent-kv"}
		eventually(t, settle, fmt.Sprintf("%T owned by the pool", obj), func() error {
			if err := c.Get(ctx, key, obj); err != nil {
				return err
			}
			refs := obj.GetOwnerReferences()
			if len(refs) != 1 || refs[0].Kind != "TransferPool" || refs[0].Name != "kv" || refs[0].Controller == nil || !*refs[0].Controller {
				return fmt.Errorf("owner references %v", refs)
			}
			return nil
		})
	}
	clusterName := "fabricxfer-agent-" + ns + "-kv"
	eventually(t, settle, "cluster RBAC", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: clusterName}, &rbacv1.ClusterRole{}); err != nil {
			return err
		}
		return c.Get(ctx, client.ObjectKey{Name: clusterName}, &rbacv1.ClusterRoleBinding{})
	})
	eventually(t, settle, "agent certificates", func() error {
		s := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fabricxfer-agent-kv-tls"}, s); err != nil {
			return err
		}
		for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
			if len(s.Data[k]) == 0 {
				return fmt.Errorf("secret lacks %s", k)
			}
		}
		return nil
	})

	// A changed pool changes the DaemonSet (retrying while the operator writes status).
	var got *fxv1.TransferPool
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if got, err = getPool(c, pool); err != nil {
			return err
		}
		got.Spec.NodeSelector = map[string]string{"fabricxfer.io/test-group": "owns-2"}
		got.Spec.Agent.HeartbeatSeconds = 5
		return c.Update(ctx, got)
	}); err != nil {
		t.Fatalf("updating pool: %v", err)
	}
	eventually(t, settle, "DaemonSet follows the pool", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fabricxfer-agent-kv"}, ds); err != nil {
			return err
		}
		if ds.Spec.Template.Spec.NodeSelector["fabricxfer.io/test-group"] != "owns-2" {
			return fmt.Errorf("node selector %v", ds.Spec.Template.Spec.NodeSelector)
		}
		if !strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), "--heartbeat=5s") {
			return fmt.Errorf("args %v", ds.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})

	// Deleting the pool removes the cluster-scoped RBAC (finalizer); namespaced objects carry owner references.
	if err := c.Delete(ctx, got); err != nil {
		t.Fatalf("deleting pool: %v", err)
	}
	eventually(t, settle, "pool and cluster RBAC gone", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &fxv1.TransferPool{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pool still there: %v", err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: clusterName}, &rbacv1.ClusterRole{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster role still there: %v", err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: clusterName}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster role binding still there: %v", err)
		}
		return nil
	})
}

func TestPoolStatusCountsReportingNodes(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "status", 3)
	pool := newPool(t, c, ns, "kv", "status")

	got := waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/3")
	if p := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionProgressing); p == nil || p.Status != metav1.ConditionTrue {
		t.Errorf("Progressing = %+v, want True while no agent reported", p)
	}

	now := time.Now()
	domain := &fxv1.FabricMembership{Kind: fxv1.FabricUALink, Domain: "ualink:90/1"}
	report(t, c, pool, nodes[0], now, []fxv1.GPU{{Index: 0, Vendor: fxv1.VendorAMD, PCIBusID: "0000:0c:00.0", Fabric: domain}},
		fxv1.EngineXGMI, fxv1.EngineFabric, fxv1.EngineTCP)
	waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/3")

	report(t, c, pool, nodes[1], now, nil, fxv1.EngineRDMA, fxv1.EngineTCP)
	report(t, c, pool, nodes[2], now, nil, fxv1.EngineTCP)
	got = waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "3/3")
	if got.Status.EngineSummary != "xgmi=1 fabric=1 rdma=1 tcp=3" {
		t.Errorf("engine summary = %q", got.Status.EngineSummary)
	}
	if len(got.Status.VPods) != 1 || got.Status.VPods[0] != fxv1.DomainObjectName("ualink:90/1") {
		t.Errorf("vpods = %v", got.Status.VPods)
	}

	// A node whose agent stopped heartbeating is not ready and degrades the pool.
	report(t, c, pool, nodes[2], now.Add(-time.Hour), nil, fxv1.EngineTCP)
	got = waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "2/3")
	if d := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue {
		t.Errorf("Degraded = %+v, want True for a node that went quiet", d)
	}
	if len(got.Status.NotReadyNodes) != 1 || got.Status.NotReadyNodes[0] != nodes[2] {
		t.Errorf("notReadyNodes = %v", got.Status.NotReadyNodes)
	}
}

func TestPoolsSelectingTheSameNodesConflict(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	newNodes(t, c, "conflict", 1)
	a := newPool(t, c, ns, "a", "conflict")
	b := newPool(t, c, ns, "b", "conflict")
	gotA := waitPool(t, c, a, metav1.ConditionFalse, fxv1.ReasonConflict, "0/1")
	gotB := waitPool(t, c, b, metav1.ConditionFalse, fxv1.ReasonConflict, "0/1")
	if len(gotA.Status.ConflictingPools) != 1 || gotA.Status.ConflictingPools[0] != ns+"/b" {
		t.Errorf("pool a conflicts = %v", gotA.Status.ConflictingPools)
	}
	if len(gotB.Status.ConflictingPools) != 1 || gotB.Status.ConflictingPools[0] != ns+"/a" {
		t.Errorf("pool b conflicts = %v", gotB.Status.ConflictingPools)
	}
	// Resolving the conflict clears it on the other pool too.
	if err := c.Delete(context.Background(), gotB); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, a, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/1")
}

func TestPoolWithoutMatchingNodes(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "empty", "nobody-has-this-label")
	got := waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, "0/0")
	cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
	if !strings.Contains(cond.Message, "nodeSelector") {
		t.Errorf("message %q should point at the selector", cond.Message)
	}
}
