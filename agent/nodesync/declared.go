// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// DeclarationWatch keeps the VPodTopologies that declare GPUs of one node. It lists and watches only those
// carrying the node's member label (v1alpha1.MemberLabel, set by the operator on declared VPodTopologies), so
// an agent receives the declarations of its own node and not every vPOD of the cluster.
type DeclarationWatch struct {
	node string
	c    client.WithWatch
	log  logr.Logger

	mu     sync.Mutex
	byName map[string]*v1alpha1.VPodTopology
	synced chan struct{}
	once   sync.Once

	received atomic.Int64
}

// NewDeclarationWatch returns a watch of node's declarations; Run starts it.
func NewDeclarationWatch(c client.WithWatch, node string, log logr.Logger) *DeclarationWatch {
	return &DeclarationWatch{node: node, c: c, log: log, byName: map[string]*v1alpha1.VPodTopology{}, synced: make(chan struct{})}
}

// Received counts the VPodTopologies the API server sent this watch (list items and watch events).
func (w *DeclarationWatch) Received() int64 { return w.received.Load() }

// Synced reports whether the first list arrived (it does not wait for it).
func (w *DeclarationWatch) Synced() bool {
	select {
	case <-w.synced:
		return true
	default:
		return false
	}
}

// Declarations are the node's declarations, the oldest VPodTopology first (then by name): where two declare
// one GPU, the earlier keeps it, as the operator's DomainOwners prefers the older object.
func (w *DeclarationWatch) Declarations() []topology.Declaration {
	w.mu.Lock()
	vps := make([]*v1alpha1.VPodTopology, 0, len(w.byName))
	for _, vp := range w.byName {
		vps = append(vps, vp)
	}
	w.mu.Unlock()
	return declarationsOf(vps, w.node)
}

// ListDeclarations reads node's declarations once (agent detect).
func ListDeclarations(ctx context.Context, c client.Reader, node string) ([]topology.Declaration, error) {
	var list v1alpha1.VPodTopologyList
	if err := c.List(ctx, &list, client.HasLabels{v1alpha1.MemberLabel(node)}); err != nil {
		return nil, fmt.Errorf("listing the VPodTopologies that declare node %s: %w", node, err)
	}
	vps := make([]*v1alpha1.VPodTopology, len(list.Items))
	for i := range list.Items {
		vps[i] = &list.Items[i]
	}
	return declarationsOf(vps, node), nil
}

// declarationsOf turns the VPodTopologies that list node in spec.members into declarations, oldest first. The
// label only selects: anyone who may write a VPodTopology may set it, so membership is read from the spec.
func declarationsOf(vps []*v1alpha1.VPodTopology, node string) []topology.Declaration {
	vps = slices.DeleteFunc(slices.Clone(vps), func(vp *v1alpha1.VPodTopology) bool {
		return vp.Labels[v1alpha1.LabelDiscovered] == "true" || vp.DeletionTimestamp != nil
	})
	slices.SortFunc(vps, func(a, b *v1alpha1.VPodTopology) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var out []topology.Declaration
	for _, vp := range vps {
		for _, m := range vp.Spec.Members {
			if m.Node != node {
				continue
			}
			d := topology.Declaration{Name: vp.Name, Domain: vp.Spec.Domain}
			for _, g := range m.GPUs {
				d.GPUs = append(d.GPUs, int(g))
			}
			out = append(out, d)
		}
	}
	return out
}

// Run lists and watches until ctx ends, starting again from a list after a failure.
func (w *DeclarationWatch) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := w.watchOnce(ctx); err != nil && ctx.Err() == nil {
			w.log.Error(err, "watching the node's vPOD declarations", "node", w.node, "retryIn", ownWatchRetry)
			t := time.NewTimer(ownWatchRetry)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
	return nil
}

func (w *DeclarationWatch) watchOnce(ctx context.Context) error {
	selector := client.HasLabels{v1alpha1.MemberLabel(w.node)}
	var list v1alpha1.VPodTopologyList
	if err := w.c.List(ctx, &list, selector); err != nil {
		return fmt.Errorf("listing the VPodTopologies that declare node %s: %w", w.node, err)
	}
	w.received.Add(int64(len(list.Items)))
	fresh := make(map[string]*v1alpha1.VPodTopology, len(list.Items))
	for i := range list.Items {
		fresh[list.Items[i].Name] = &list.Items[i]
	}
	w.mu.Lock()
	w.byName = fresh
	w.mu.Unlock()
	w.once.Do(func() { close(w.synced) })
	ww, err := w.c.Watch(ctx, &v1alpha1.VPodTopologyList{}, selector,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}})
	if err != nil {
		return fmt.Errorf("watching the VPodTopologies that declare node %s: %w", w.node, err)
	}
	defer ww.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-ww.ResultChan():
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Error:
				return fmt.Errorf("watching the VPodTopologies that declare node %s: %w", w.node, apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				continue
			}
			vp, ok := ev.Object.(*v1alpha1.VPodTopology)
			if !ok {
				continue
			}
			w.received.Add(1)
			w.mu.Lock()
			if ev.Type == watch.Deleted {
				// Also sent when the object stops carrying the node's label.
				delete(w.byName, vp.Name)
			} else {
				w.byName[vp.Name] = vp
			}
			w.mu.Unlock()
		}
	}
}
