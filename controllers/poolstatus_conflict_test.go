// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// laggingReader serves one pool as it was at an earlier moment, as a cache that has not caught up does, and
// everything else as the API server has it.
type laggingReader struct {
	client.Client
	stale *fxv1.TransferPool
}

func (l laggingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if p, ok := obj.(*fxv1.TransferPool); ok && key == client.ObjectKeyFromObject(l.stale) {
		l.stale.DeepCopyInto(p)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// A reconcile that reads the pool from a cache older than the pool's last write (another controller's
// condition, here) merges with that write instead of failing with a conflict: the status it writes counts the
// node that reported, and the other writer's condition is still there. Returned as an error, each such
// conflict doubled the pool's work-queue backoff while nodes reported.
func TestPoolStatusWriteFromAStaleCacheMergesInsteadOfFailing(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "stale-cache", 2)
	pool := newPool(t, c, ns, "stale", "stale-cache")
	waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/2")
	stale, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}

	// Another writer's condition lands after the copy the lagging cache serves.
	other := metav1.Condition{Type: "ExampleOther", Status: metav1.ConditionTrue, Reason: "WrittenElsewhere",
		Message: "kept by whoever writes the pool's status next", LastTransitionTime: metav1.Now()}
	// The operator's own controllers write this pool too (the certificate condition): read again on a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fresh, err := getPool(c, pool)
		if err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(fresh.DeepCopy(), client.MergeFromWithOptimisticLock{})
		meta.SetStatusCondition(&fresh.Status.Conditions, other)
		return c.Status().Patch(ctx, fresh, patch)
	}); err != nil {
		t.Fatalf("writing another controller's condition: %v", err)
	}
	report(t, c, pool, nodes[0], time.Now(), nil)

	r := &TransferPoolReconciler{Client: laggingReader{Client: c, stale: stale}, APIReader: c, Scheme: c.Scheme(),
		Agent: testAgentSettings, Clock: clock.RealClock{}}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)}); err != nil {
		t.Fatalf("reconcile from a stale copy of the pool: %v", err)
	}
	got, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.ReadyNodes != 1 || got.Status.Nodes != "1/2" {
		t.Errorf("status counts %d ready (%s), want the node that reported", got.Status.ReadyNodes, got.Status.Nodes)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, other.Type); c == nil || c.Reason != other.Reason {
		t.Errorf("the other writer's condition is gone: %+v", got.Status.Conditions)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady); c == nil || c.Reason != fxv1.ReasonNodesNotReady || c.ObservedGeneration != got.Generation {
		t.Errorf("Ready condition %+v, want NodesNotReady at generation %d", c, got.Generation)
	}
}

// The reconciler prefers its own last write of a pool to the cache's copy only while that write is newer and of
// the same pool.
func TestPoolNewestOfPrefersOwnNewerWrite(t *testing.T) {
	r := &TransferPoolReconciler{}
	pool := func(uid types.UID, rv string) *fxv1.TransferPool {
		return &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: uid, ResourceVersion: rv}}
	}
	r.rememberWritten(pool("a", "20"))
	if got := r.newestOf(pool("a", "17")); got.ResourceVersion != "20" {
		t.Errorf("cache at 17, own write at 20: got %s", got.ResourceVersion)
	}
	if got := r.newestOf(pool("a", "21")); got.ResourceVersion != "21" {
		t.Errorf("cache at 21, own write at 20: got %s", got.ResourceVersion)
	}
	// Once the cache caught up the own write is forgotten, so an older cache copy is not overridden by it.
	if got := r.newestOf(pool("a", "19")); got.ResourceVersion != "19" {
		t.Errorf("after the cache caught up: got %s", got.ResourceVersion)
	}
	r.rememberWritten(pool("a", "30"))
	if got := r.newestOf(pool("b", "5")); got.UID != "b" {
		t.Errorf("a recreated pool (uid b) was served the old pool's write: %+v", got.ObjectMeta)
	}
}
