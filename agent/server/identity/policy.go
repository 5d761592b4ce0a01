// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// NamespacePolicy says which namespaces may use the pool (the TransferPool's spec.allowedNamespaces).
type NamespacePolicy interface {
	AllowedNamespaces(ctx context.Context) ([]string, error)
}

// Admit says whether the pool poolNamespace/poolName, under policy, admits namespace: nil, or an error naming the
// namespaces it admits (the socket's refusal and the DRA driver's share it).
func Admit(ctx context.Context, policy NamespacePolicy, poolNamespace, poolName, namespace string) error {
	allowed, err := policy.AllowedNamespaces(ctx)
	if err != nil {
		return fmt.Errorf("reading the allowed namespaces of pool %s/%s: %w", poolNamespace, poolName, err)
	}
	if NamespaceAllowed(poolNamespace, allowed, namespace) {
		return nil
	}
	shown := allowed
	if len(shown) == 0 {
		shown = []string{poolNamespace + " (the pool's own namespace)"}
	}
	return fmt.Errorf("namespace %q may not use pool %s/%s (allowed: %v)", namespace, poolNamespace, poolName, shown)
}

// StaticPolicy is a fixed allowedNamespaces list (flags, tests).
type StaticPolicy []string

// AllowedNamespaces implements NamespacePolicy.
func (p StaticPolicy) AllowedNamespaces(context.Context) ([]string, error) { return p, nil }

// APIPoolPolicy reads the pool's spec.allowedNamespaces from its TransferPool, so an admin's edit applies to
// the next connection without restarting agents, and ends held sessions of namespaces it no longer allows
// (checked every 2 s). Answers are cached for TTL (default 5 s, so a removal takes effect within
// 10 s) to keep connection setup cheap; if the API server cannot be reached, the last answer is used for up to
// ten times as long.
type APIPoolPolicy struct {
	Reader    client.Reader
	Namespace string
	Name      string
	TTL       time.Duration

	// turn is held by the one caller asking the API server; the others wait for it within their own contexts
	// (a mutex would hold them past their deadlines while the API server stalls).
	turnOnce sync.Once
	turn     chan struct{}
	// mu guards the last answer, which a caller that gave up waiting for its turn may still use.
	mu     sync.Mutex
	cached []string
	at     time.Time
}

// AllowedNamespaces implements NamespacePolicy.
func (p *APIPoolPolicy) AllowedNamespaces(ctx context.Context) ([]string, error) {
	ttl := p.TTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	p.turnOnce.Do(func() { p.turn = make(chan struct{}, 1) })
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		if last, ok := p.last(10 * ttl); ok {
			return last, nil
		}
		return nil, fmt.Errorf("reading TransferPool %s/%s: waiting for the read under way: %w", p.Namespace, p.Name, ctx.Err())
	}
	defer func() { <-p.turn }()
	if last, ok := p.last(ttl); ok {
		return last, nil
	}
	var pool fxv1.TransferPool
	if err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, &pool); err != nil {
		if last, ok := p.last(10 * ttl); ok {
			return last, nil
		}
		return nil, fmt.Errorf("reading TransferPool %s/%s: %w", p.Namespace, p.Name, err)
	}
	p.mu.Lock()
	p.cached, p.at = slices.Clone(pool.Spec.AllowedNamespaces), time.Now()
	p.mu.Unlock()
	return slices.Clone(pool.Spec.AllowedNamespaces), nil
}

// last returns the last answer if it is younger than age.
func (p *APIPoolPolicy) last(age time.Duration) ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at.IsZero() || time.Since(p.at) >= age {
		return nil, false
	}
	return slices.Clone(p.cached), true
}
