// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// APIPodResolver finds pods through the API server. The API server cannot select pods by UID, so it lists
// the pods bound to this node (spec.nodeName) and remembers UID -> namespace/name; a pod's namespace and name
// never change for its UID, so entries need no invalidation, only a bound on how many are kept.
type APIPodResolver struct {
	// Reader should read straight from the API server (client.New), not a cache, so a pod that just started
	// is found on the first connection.
	Reader client.Reader
	// NodeName limits the search to pods on this node; empty searches every pod (tests without nodes).
	NodeName string
	// MaxEntries bounds the remembered pods (default 4096).
	MaxEntries int

	mu    sync.Mutex
	known map[string]PodRef
}

// PodByUID implements PodResolver.
func (r *APIPodResolver) PodByUID(ctx context.Context, uid string) (PodRef, error) {
	r.mu.Lock()
	if ref, ok := r.known[uid]; ok {
		r.mu.Unlock()
		return ref, nil
	}
	r.mu.Unlock()

	var pods corev1.PodList
	var opts []client.ListOption
	if r.NodeName != "" {
		opts = append(opts, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", r.NodeName)})
	}
	if err := r.Reader.List(ctx, &pods, opts...); err != nil {
		return PodRef{}, fmt.Errorf("listing pods on node %q: %w", r.NodeName, err)
	}
	var found *PodRef
	r.mu.Lock()
	defer r.mu.Unlock()
	limit := r.MaxEntries
	if limit <= 0 {
		limit = 4096
	}
	if r.known == nil || len(r.known) > limit {
		r.known = map[string]PodRef{}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		ref := PodRef{Namespace: p.Namespace, Name: p.Name}
		if len(r.known) < limit {
			r.known[string(p.UID)] = ref
		}
		if string(p.UID) == uid {
			found = &ref
		}
	}
	if found == nil {
		return PodRef{}, fmt.Errorf("pod %s on node %q: %w", uid, r.NodeName, ErrPodNotFound)
	}
	return *found, nil
}
