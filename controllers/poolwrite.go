// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Three controllers write each pool: the pool controller its aggregate status, the agents controller its
// AgentsReady condition and finalizer, the certificate controller its CertificatesReady condition and
// finalizer. A merge patch replaces whole lists (conditions, finalizers), so every write carries the pool's
// resourceVersion: a write from a copy that lacks another controller's latest one is refused, not allowed to
// drop it. Refused, the writer reads the pool again from the API server and makes its change on that copy:
// the other controller's write is something to merge with, not a failure to back off from.

// poolWriteAttempts bounds the writes of one change: each after the first is made on a copy just read from the
// API server, so a conflict means another controller wrote in between. When a pool is created all three write
// it within milliseconds (finalizers, first conditions), and two conflicts in a row were common in the tests.
const poolWriteAttempts = 4

// changePool changes one controller's part of a pool and reports whether anything changed. It is called
// again on a fresh copy after a conflict, and must decide from that copy alone (a copy of a later
// generation, or one being deleted, may need no change).
type changePool func(*fxv1.TransferPool) bool

// writePool applies change to pool and patches what changed (the status subresource when status is true),
// under the pool's resourceVersion. Refused for a newer version, it reads the pool from reader and tries again
// on that copy, at most poolWriteAttempts writes in all; the last one's conflict is an error. On success pool is the written pool and before the copy
// the patch was computed from (what the change changed); before is nil when nothing was written (no change,
// or the pool is gone or was replaced by another of its name).
func writePool(ctx context.Context, c client.Client, reader client.Reader, pool *fxv1.TransferPool, status bool, change changePool) (before *fxv1.TransferPool, err error) {
	key := client.ObjectKeyFromObject(pool)
	uid := pool.UID
	for attempt := 1; ; attempt++ {
		before = pool.DeepCopy()
		if !change(pool) {
			return nil, nil
		}
		patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		if status {
			err = c.Status().Patch(ctx, pool, patch)
		} else {
			err = c.Patch(ctx, pool, patch)
		}
		switch {
		case err == nil:
			return before, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		case !apierrors.IsConflict(err) || attempt >= poolWriteAttempts:
			return nil, fmt.Errorf("patching pool %s: %w", key, err)
		}
		fresh := &fxv1.TransferPool{}
		if err := reader.Get(ctx, key, fresh); err != nil {
			return nil, client.IgnoreNotFound(fmt.Errorf("reading pool %s again after a conflicting write: %w", key, err))
		}
		if fresh.UID != uid {
			return nil, nil // another pool of the name: its own events bring its reconcile
		}
		*pool = *fresh
	}
}

// setPoolCondition writes one condition of the pool's status and nothing else, for the generation the
// condition names: a pool found at a later generation is left to the reconcile its new spec brings. It
// returns the condition as it was before the write (nil when there was none), and whether it wrote.
func setPoolCondition(ctx context.Context, c client.Client, reader client.Reader, pool *fxv1.TransferPool, cond metav1.Condition) (was *metav1.Condition, wrote bool, err error) {
	before, err := writePool(ctx, c, reader, pool, true, func(p *fxv1.TransferPool) bool {
		if p.Generation != cond.ObservedGeneration || !p.DeletionTimestamp.IsZero() {
			return false
		}
		cond.Message = boundedMessage(cond.Message)
		return meta.SetStatusCondition(&p.Status.Conditions, cond)
	})
	if err != nil || before == nil {
		return nil, false, err
	}
	if old := meta.FindStatusCondition(before.Status.Conditions, cond.Type); old != nil {
		was = old.DeepCopy()
	}
	return was, true, nil
}

// setPoolFinalizer adds (add) or removes one controller's finalizer of the pool. A finalizer is added only to
// a pool whose deletion has not begun (the API server refuses new finalizers then, and nothing should be
// made for such a pool). It reports whether it wrote.
func setPoolFinalizer(ctx context.Context, c client.Client, reader client.Reader, pool *fxv1.TransferPool, finalizer string, add bool) (bool, error) {
	before, err := writePool(ctx, c, reader, pool, false, func(p *fxv1.TransferPool) bool {
		if add {
			return p.DeletionTimestamp.IsZero() && controllerutil.AddFinalizer(p, finalizer)
		}
		return controllerutil.RemoveFinalizer(p, finalizer)
	})
	if err != nil {
		verb := "removing"
		if add {
			verb = "adding"
		}
		return false, fmt.Errorf("%s finalizer %s of pool %s/%s: %w", verb, finalizer, pool.Namespace, pool.Name, err)
	}
	return before != nil, nil
}
