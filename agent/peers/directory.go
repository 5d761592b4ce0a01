// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Directory finds the agents of the pool.
type Directory interface {
	// Endpoint returns node's agent-to-agent address (host:port).
	Endpoint(ctx context.Context, node string) (string, error)
	// Nodes returns every known node of the pool and its endpoint.
	Nodes(ctx context.Context) (map[string]string, error)
}

// StaticDirectory is a fixed node -> endpoint map (the demo outside Kubernetes, tests).
type StaticDirectory map[string]string

// Endpoint implements Directory. A node that is not listed is NotFound: a caller that retries Unavailable would
// retry a mistyped node name forever.
func (d StaticDirectory) Endpoint(_ context.Context, node string) (string, error) {
	ep, ok := d[node]
	if !ok {
		return "", status.Errorf(codes.NotFound, "node %q is not in the peer list (--peers)", node)
	}
	return ep, nil
}

// Nodes implements Directory.
func (d StaticDirectory) Nodes(context.Context) (map[string]string, error) {
	out := make(map[string]string, len(d))
	for k, v := range d {
		out[k] = v
	}
	return out, nil
}

// APIDirectory reads TransferNode .status.endpoint through the API server. A TransferNode is named after its
// node, so a single lookup is a GET; endpoints are cached for TTL (default 30 s).
type APIDirectory struct {
	Reader        client.Reader
	PoolNamespace string
	PoolName      string
	TTL           time.Duration

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	endpoint string
	at       time.Time
}

func (d *APIDirectory) ttl() time.Duration {
	if d.TTL <= 0 {
		return 30 * time.Second
	}
	return d.TTL
}

func (d *APIDirectory) member(tn *fxv1.TransferNode) bool {
	return tn.Spec.PoolNamespace == d.PoolNamespace && tn.Spec.PoolName == d.PoolName && tn.Status.Endpoint != ""
}

// Endpoint implements Directory.
func (d *APIDirectory) Endpoint(ctx context.Context, node string) (string, error) {
	d.mu.Lock()
	if c, ok := d.cache[node]; ok && time.Since(c.at) < d.ttl() {
		d.mu.Unlock()
		return c.endpoint, nil
	}
	d.mu.Unlock()
	var tn fxv1.TransferNode
	if err := d.Reader.Get(ctx, types.NamespacedName{Name: node}, &tn); err != nil {
		if apierrors.IsNotFound(err) {
			return "", status.Errorf(codes.NotFound, "node %q has no TransferNode: no agent of pool %s/%s runs there", node, d.PoolNamespace, d.PoolName)
		}
		return "", fmt.Errorf("looking up TransferNode %s: %w", node, err)
	}
	if !d.member(&tn) {
		// Another pool's node is not this pool's (NotFound); this pool's agent without an endpoint yet is starting.
		code := codes.NotFound
		if tn.Spec.PoolNamespace == d.PoolNamespace && tn.Spec.PoolName == d.PoolName {
			code = codes.Unavailable
		}
		return "", status.Errorf(code, "node %s has no agent of pool %s/%s with an endpoint (TransferNode reports pool %s/%s, endpoint %q)",
			node, d.PoolNamespace, d.PoolName, tn.Spec.PoolNamespace, tn.Spec.PoolName, tn.Status.Endpoint)
	}
	d.remember(node, tn.Status.Endpoint)
	return tn.Status.Endpoint, nil
}

func (d *APIDirectory) remember(node, endpoint string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cache == nil {
		d.cache = map[string]cached{}
	}
	d.cache[node] = cached{endpoint: endpoint, at: time.Now()}
}

// Nodes implements Directory.
func (d *APIDirectory) Nodes(ctx context.Context) (map[string]string, error) {
	var list fxv1.TransferNodeList
	if err := d.Reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing TransferNodes: %w", err)
	}
	out := map[string]string{}
	for i := range list.Items {
		tn := &list.Items[i]
		if d.member(tn) {
			out[tn.Name] = tn.Status.Endpoint
			d.remember(tn.Name, tn.Status.Endpoint)
		}
	}
	return out, nil
}
