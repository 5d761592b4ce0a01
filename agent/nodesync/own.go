// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// observation is what the watch of the agent's own TransferNode saw: the object, or nil when it is gone.
// current marks the state read by a (re)list, as opposed to an event that may predate the agent's last write.
type observation struct {
	obj     *v1alpha1.TransferNode
	current bool
}

// ownWatchRetry is the pause before the watch of the own TransferNode is established again after it failed;
// a watch that ends normally (the API server's timeout) is re-established at once.
const ownWatchRetry = time.Second

// watchOwn lists and watches the agent's own TransferNode, and no other: the field selector on metadata.name
// makes the API server send this agent only its object's events, so thousands of agents do not each receive
// every node's heartbeat-driven writes. It sends what it sees until ctx ends.
func (r *Reporter) watchOwn(ctx context.Context, out chan<- observation) {
	for ctx.Err() == nil {
		if err := r.watchOwnOnce(ctx, out); err != nil && ctx.Err() == nil {
			r.cfg.Log.Error(err, "watching own TransferNode", "node", r.cfg.NodeName, "retryIn", ownWatchRetry)
			t := time.NewTimer(ownWatchRetry)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// watchOwnOnce lists the own TransferNode (to start from the current state) and watches it from there until
// the watch ends or fails.
func (r *Reporter) watchOwnOnce(ctx context.Context, out chan<- observation) error {
	selector := client.MatchingFields{"metadata.name": r.cfg.NodeName}
	var list v1alpha1.TransferNodeList
	if err := r.cfg.Watch.List(ctx, &list, selector); err != nil {
		return fmt.Errorf("listing own TransferNode %s: %w", r.cfg.NodeName, err)
	}
	first := observation{current: true}
	for i := range list.Items {
		if list.Items[i].Name == r.cfg.NodeName {
			first.obj = &list.Items[i]
		}
	}
	if !send(ctx, out, first) {
		return nil
	}
	w, err := r.cfg.Watch.Watch(ctx, &v1alpha1.TransferNodeList{}, selector,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return fmt.Errorf("watching own TransferNode %s: %w", r.cfg.NodeName, err)
	}
	defer w.Stop()
	r.watching.Store(true)
	defer r.watching.Store(false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Error:
				// Most often 410 Gone: the watch fell too far behind. Start again from a list.
				return fmt.Errorf("watching own TransferNode %s: %w", r.cfg.NodeName, apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				continue
			}
			tn, isTN := ev.Object.(*v1alpha1.TransferNode)
			if !isTN {
				continue
			}
			r.watchEvents.Add(1)
			o := observation{obj: tn}
			if ev.Type == watch.Deleted {
				o.obj = nil
			}
			if !send(ctx, out, o) {
				return nil
			}
		}
	}
}

// send hands o to Run, or gives up when ctx ends, so the watch never outlives Run blocked on a send.
func send(ctx context.Context, out chan<- observation, o observation) bool {
	select {
	case out <- o:
		return true
	case <-ctx.Done():
		return false
	}
}

// observe takes what the watch saw and reports whether the TransferNode must be written again now: it is gone,
// or its status is not what the agent last wrote. A single object's events arrive in order, so after a write
// the events before that write's own event predate it and are skipped: rewriting on them would be a write
// caused by the agent's own earlier state. A list (at start, or after the watch failed) may predate a write
// that was in flight when it was sent, so unless it shows the agent's last write, the object is read again
// and the events up to what that read showed are skipped in turn.
func (r *Reporter) observe(ctx context.Context, o observation) bool {
	if o.obj != nil {
		r.seenVersion = o.obj.ResourceVersion
	}
	if !o.current && !r.caughtUp {
		if o.obj != nil && o.obj.ResourceVersion == r.awaitVersion {
			r.caughtUp = true
		}
		return false
	}
	if r.written == nil {
		return false // nothing written yet: the next round writes anyway
	}
	obj := o.obj
	if o.current && (obj == nil || obj.ResourceVersion != r.awaitVersion) {
		var fresh v1alpha1.TransferNode
		switch err := r.cfg.Client.Get(ctx, client.ObjectKey{Name: r.cfg.NodeName}, &fresh); {
		case apierrors.IsNotFound(err):
			obj = nil
			r.caughtUp = true
		case err != nil:
			r.cfg.Log.Error(err, "reading own TransferNode to compare it with what the agent wrote", "node", r.cfg.NodeName)
			return false // the next list (or the periodic round, should the object be gone) tries again
		default:
			// Events up to the one of what was read are older than the read: wait for it, unless the list
			// already was it.
			r.caughtUp = o.obj != nil && o.obj.ResourceVersion == fresh.ResourceVersion
			r.awaitVersion = fresh.ResourceVersion
			obj = &fresh
		}
	} else {
		r.caughtUp = true
	}
	if !r.differs(obj) {
		return false
	}
	r.rewrites.Add(1)
	if obj == nil {
		r.cfg.Log.Info("own TransferNode deleted by someone else; writing it again", "node", r.cfg.NodeName,
			"rewrites", r.rewrites.Load())
		r.objectApplied, r.nodeUID, r.applied, r.written = false, "", nil, nil
		return true
	}
	r.cfg.Log.Info("own TransferNode status changed by someone else; writing it back", "node", r.cfg.NodeName,
		"fields", statusDiff(obj.Status, *r.written), "resourceVersion", obj.ResourceVersion,
		"managers", managersOf(obj), "rewrites", r.rewrites.Load())
	r.applied = nil
	return true
}

// awaitWrite makes the watch skip events until the one of the agent's write that left the object at version.
// A write that changed nothing (an apply of the same values) leaves the version the watch already delivered, and
// waiting for it would ignore every later change.
func (r *Reporter) awaitWrite(version string) {
	r.awaitVersion, r.caughtUp = version, version == r.seenVersion
}

// differs reports whether the object (nil: absent) is not what the agent last wrote.
func (r *Reporter) differs(obj *v1alpha1.TransferNode) bool {
	return obj == nil || len(statusDiff(obj.Status, *r.written)) > 0
}

// managersOf names the field managers of the object, to tell whoever reads the log who wrote it.
func managersOf(obj *v1alpha1.TransferNode) []string {
	var out []string
	for _, mf := range obj.ManagedFields {
		if m := mf.Manager + "/" + string(mf.Operation); mf.Manager != FieldManager && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// statusFields is a status as JSON fields; every status field is the agent's, so each one is compared.
func statusFields(st v1alpha1.TransferNodeStatus) (map[string]any, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encoding TransferNode status: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("encoding TransferNode status: %w", err)
	}
	return m, nil
}

// statusDiff names the top-level status fields (as in JSON) whose values differ, sorted: names only, for the
// log, since a value could be anything someone else wrote.
func statusDiff(a, b v1alpha1.TransferNodeStatus) []string {
	am, errA := statusFields(a)
	bm, errB := statusFields(b)
	if errA != nil || errB != nil {
		return []string{"(unencodable)"}
	}
	var out []string
	for k, v := range am {
		if w, ok := bm[k]; !ok || !reflect.DeepEqual(v, w) {
			out = append(out, k)
		}
	}
	for k := range bm {
		if _, ok := am[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// clearForeign makes the status exactly st after an apply left fields that someone else added: an apply sets
// and takes the fields it names but leaves fields it does not name (a forged endpoint where the agent has none,
// an engine entry of another name), and applying again would change nothing. One merge patch replaces the
// differing top-level fields with the agent's values, or removes them. got is the object the apply returned;
// after the patch it is the object as patched.
func (r *Reporter) clearForeign(ctx context.Context, got *v1alpha1.TransferNode, st v1alpha1.TransferNodeStatus) error {
	stored := st // as the API server stores it: times in whole seconds
	if st.LastHeartbeat != nil {
		beat := st.LastHeartbeat.Rfc3339Copy()
		stored.LastHeartbeat = &beat
	}
	if equality.Semantic.DeepEqual(got.Status, stored) {
		return nil // the usual case, told without encoding either status
	}
	fields := statusDiff(got.Status, st)
	if len(fields) == 0 {
		return nil
	}
	want, err := statusFields(st)
	if err != nil {
		return err
	}
	patch := map[string]any{}
	for _, f := range fields {
		patch[f] = want[f] // nil (JSON null) removes the field
	}
	raw, err := json.Marshal(map[string]any{"status": patch})
	if err != nil {
		return fmt.Errorf("encoding TransferNode status patch: %w", err)
	}
	r.cfg.Log.Info("removing status fields the agent does not set", "node", r.cfg.NodeName, "fields", fields)
	if err := r.cfg.Client.Status().Patch(ctx, got, client.RawPatch(types.MergePatchType, raw), client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("removing foreign fields %v of TransferNode %s status: %w", fields, r.cfg.NodeName, err)
	}
	return nil
}
