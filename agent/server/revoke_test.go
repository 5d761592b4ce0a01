// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/client"
)

// mutablePolicy is an allowedNamespaces list a test edits, as an admin edits the TransferPool.
type mutablePolicy struct {
	mu      sync.Mutex
	allowed []string
}

func (p *mutablePolicy) AllowedNamespaces(context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.allowed...), nil
}

func (p *mutablePolicy) set(ns ...string) {
	p.mu.Lock()
	p.allowed = ns
	p.mu.Unlock()
}

// pods resolves fixed pod UIDs.
type pods map[string]identity.PodRef

func (p pods) PodByUID(_ context.Context, uid string) (identity.PodRef, error) {
	if ref, ok := p[uid]; ok {
		return ref, nil
	}
	return identity.PodRef{}, identity.ErrPodNotFound
}

const (
	podInfer = "11111111-2222-3333-4444-555555555555"
	podOther = "66666666-7777-8888-9999-aaaaaaaaaaaa"
)

// Removing a namespace from allowedNamespaces ends the sessions its pods hold, with their regions, within
// 10 s; a pod of a namespace that stays allowed keeps its regions and bytes.
func TestRevocationEndsHeldSessions(t *testing.T) {
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	policy := &mutablePolicy{allowed: []string{"infer", "other"}}
	opts.Policy = policy
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: pods{
		podInfer: {Namespace: "infer", Name: "prefill-0"}, podOther: {Namespace: "other", Name: "decode-0"}}}
	a := startAgent(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	proc.setPod(t, podInfer)
	ci := dial(t, a)
	mi := shm(t, 1<<20)
	ri, err := ci.RegisterHost(ctx, mi.File, 0, mi.Size())
	if err != nil {
		t.Fatal(err)
	}
	proc.setPod(t, podOther)
	co := dial(t, a)
	src, dst := shm(t, 1<<20), shm(t, 1<<20)
	fill(t, src.Bytes)
	rs, err := co.RegisterHost(ctx, src.File, 0, src.Size())
	if err != nil {
		t.Fatal(err)
	}
	rd, err := co.RegisterHost(ctx, dst.File, 0, dst.Size())
	if err != nil {
		t.Fatal(err)
	}
	// The infer pod's region is reachable through its descriptor while it is admitted.
	if _, err := co.Write(ctx, rs, 0, client.ToDescriptor(ri.Descriptor()), 0, 4096); err != nil {
		t.Fatalf("writing the infer pod's region while admitted: %v", err)
	}

	policy.set("other")
	revokedAt := time.Now()
	for {
		_, err := ci.Write(ctx, ri, 0, client.ToRegion(ri), 4096, 4096)
		if err != nil {
			break
		}
		if time.Since(revokedAt) > 10*time.Second {
			t.Fatal("the revoked pod's session still copies 10 s after its namespace was removed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its region is gone for everyone.
	for {
		_, err := co.Write(ctx, rs, 0, client.ToDescriptor(ri.Descriptor()), 0, 4096)
		if client.Code(err) == codes.NotFound {
			break
		}
		if time.Since(revokedAt) > 10*time.Second {
			t.Fatalf("the revoked pod's region is still reachable 10 s after revocation: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("revoked after %s", time.Since(revokedAt))
	// A new connection of the revoked pod is refused, saying why.
	proc.setPod(t, podInfer)
	if _, err := client.Dial(ctx, a.srv.SocketPath()); client.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"infer"`) {
		t.Fatalf("reconnecting after revocation: %v", err)
	}
	// The other namespace's regions and bytes are untouched.
	if _, err := co.Write(ctx, rs, 0, client.ToRegion(rd), 0, src.Size()); err != nil || !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatalf("the allowed pod's transfer after the revocation: %v", err)
	}
}
