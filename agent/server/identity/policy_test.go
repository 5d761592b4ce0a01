// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestPoolPolicyWaitsWithinEachCallersDeadline: while one connection's read of the pool hangs on an API server
// that does not answer, another connection's identification gives up at its own deadline instead of queueing
// behind the first (it held a mutex across the read, and every socket's identifications and the revoker
// waited past their deadlines). The API server here is an HTTP server that answers nothing until the request
// ends; the client is controller-runtime's, as the agent's.
func TestPoolPolicyWaitsWithinEachCallersDeadline(t *testing.T) {
	var requests atomic.Int32
	stalled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		<-r.Context().Done()
	}))
	defer stalled.Close()
	scheme := runtime.NewScheme()
	if err := fxv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(fxv1.GroupVersion.WithKind("TransferPool"), meta.RESTScopeNamespace)
	c, err := client.New(&rest.Config{Host: stalled.URL}, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	p := &APIPoolPolicy{Reader: c, Namespace: "infer", Name: "kv"}

	first, cancelFirst := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelFirst()
	firstDone := make(chan error, 1)
	go func() { _, err := p.AllowedNamespaces(first); firstDone <- err }()
	for deadline := time.Now().Add(5 * time.Second); requests.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first read never reached the API server")
		}
	}

	second, cancelSecond := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelSecond()
	start := time.Now()
	_, err = p.AllowedNamespaces(second)
	if took := time.Since(start); took > 2*time.Second || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the second caller returned after %v with %v, want its own deadline (100 ms) exceeded", took, err)
	}
	cancelFirst()
	select {
	case err := <-firstDone:
		if err == nil {
			t.Fatal("the first read succeeded against an API server that answered nothing")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first read did not end with its context")
	}

	// With an answer read a little over the TTL ago, a caller that gives up waiting uses it, as one whose own
	// read fails does (for up to ten TTLs), instead of refusing a caller the pool admits.
	p = &APIPoolPolicy{Reader: c, Namespace: "infer", Name: "kv", TTL: time.Second,
		cached: []string{"infer"}, at: time.Now().Add(-2 * time.Second)}
	first, cancelFirst = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelFirst()
	before := requests.Load()
	go func() { _, err := p.AllowedNamespaces(first); firstDone <- err }()
	for deadline := time.Now().Add(5 * time.Second); requests.Load() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second policy's read never reached the API server")
		}
	}
	second, cancelSecond = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelSecond()
	if got, err := p.AllowedNamespaces(second); err != nil || len(got) != 1 || got[0] != "infer" {
		t.Fatalf("a caller that gave up waiting, with an answer 2 s old: %v, %v; want the answer", got, err)
	}
	cancelFirst()
	if err := <-firstDone; err != nil {
		t.Fatalf("the read that timed out, with an answer 2 s old: %v; want the answer", err)
	}
}
