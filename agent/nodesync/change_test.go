// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// requestLog records the requests a client sends as "VERB resource" (apply is PATCH).
type requestLog struct {
	mu   sync.Mutex
	next http.RoundTripper
	reqs []string
}

func (l *requestLog) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != "/api" && r.URL.Path != "/apis" { // discovery, once per client
		l.mu.Lock()
		l.reqs = append(l.reqs, r.Method+" "+resourceOf(r.URL.Path))
		l.mu.Unlock()
	}
	return l.next.RoundTrip(r)
}

// take returns the requests recorded since the last take.
func (l *requestLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.reqs
	l.reqs = nil
	return out
}

func resourceOf(path string) string {
	switch {
	case strings.Contains(path, "/leases"):
		return "leases"
	case strings.Contains(path, "/transfernodes/") && strings.HasSuffix(path, "/status"):
		return "transfernodes/status"
	case strings.Contains(path, "/transfernodes"):
		return "transfernodes"
	case strings.Contains(path, "/nodes"):
		return "nodes"
	}
	return path
}

// TestReporterRewritesOnlyOnChange drives rounds by hand and checks, request by request, that a steady round is
// one Lease update, that the TransferNode is written again only when the report changes or went missing, and
// that the Node is read once.
func TestReporterRewritesOnlyOnChange(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	log := &requestLog{}
	agentCfg := rest.CopyConfig(cfg)
	agentCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { log.next = rt; return log })
	agentClient, err := client.New(agentCfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "steady"}}
	if err := admin.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	createNamespace(t, admin, "inference")

	var (
		mu         sync.Mutex
		registered int64
		nicState   = "ACTIVE"
		now        = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	)
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, PoolNamespace: "inference", PoolName: "kv", Period: 10 * time.Second,
		Identity: nodestatus.Identity{AgentVersion: "test", Endpoint: "10.0.0.9:7470"},
		Detect: func(context.Context) (topology.Report, error) {
			mu.Lock()
			defer mu.Unlock()
			return topology.Report{NICs: []topology.NIC{{Name: "mlx5_0", Port: 1, State: nicState, LinkLayer: "Ethernet"}}}, nil
		},
		Client:   agentClient,
		Log:      testr.New(t),
		Now:      func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Decorate: func(st *v1alpha1.TransferNodeStatus) { mu.Lock(); defer mu.Unlock(); st.RegisteredBytes = registered },
	})
	if err != nil {
		t.Fatal(err)
	}
	tick := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(10 * time.Second)
		return now
	}
	round := func(what string, wantReqs ...string) {
		t.Helper()
		if err := r.ReportOnce(ctx); err != nil {
			t.Fatalf("%s: ReportOnce: %v", what, err)
		}
		if got := log.take(); !slices.Equal(got, wantReqs) {
			t.Errorf("%s: requests %q, want %q", what, got, wantReqs)
		}
	}
	var tn v1alpha1.TransferNode
	read := func() {
		t.Helper()
		if err := admin.Get(ctx, client.ObjectKey{Name: node.Name}, &tn); err != nil {
			t.Fatalf("reading the TransferNode: %v", err)
		}
	}
	var lease coordinationv1.Lease
	leaseKey := client.ObjectKey{Namespace: "inference", Name: nodesync.LeaseName("kv", node.Name)}
	renewedAt := func(at time.Time) {
		t.Helper()
		if err := admin.Get(ctx, leaseKey, &lease); err != nil {
			t.Fatalf("reading the Lease: %v", err)
		}
		if !lease.Spec.RenewTime.Time.Equal(at) {
			t.Errorf("lease renewed at %s, want %s", lease.Spec.RenewTime.Time, at)
		}
	}

	first := now
	round("first round", "GET nodes", "PATCH transfernodes", "PATCH transfernodes/status", "POST leases")
	read()
	version := tn.ResourceVersion
	if tn.Status.LastHeartbeat == nil || !tn.Status.LastHeartbeat.Time.Equal(first) {
		t.Errorf("lastHeartbeat %v, want the first round's %s", tn.Status.LastHeartbeat, first)
	}
	renewedAt(first)

	for i := range 3 {
		at := tick()
		round(fmt.Sprintf("steady round %d", i+1), "PUT leases")
		renewedAt(at)
	}
	read()
	if tn.ResourceVersion != version {
		t.Errorf("TransferNode resourceVersion %s -> %s in rounds that changed nothing", version, tn.ResourceVersion)
	}

	// A decorated field changes (registered bytes): the status is written, once.
	mu.Lock()
	registered = 1 << 20
	mu.Unlock()
	at := tick()
	round("registered bytes changed", "PATCH transfernodes/status", "PUT leases")
	read()
	if tn.Status.RegisteredBytes != 1<<20 || !tn.Status.LastHeartbeat.Time.Equal(at) {
		t.Errorf("registered %d lastHeartbeat %s, want 1 MiB written at %s", tn.Status.RegisteredBytes, tn.Status.LastHeartbeat, at)
	}
	tick()
	round("steady after the change", "PUT leases")

	// Detection changes (a port goes down): the status is written.
	mu.Lock()
	nicState = "DOWN"
	mu.Unlock()
	tick()
	round("NIC down", "PATCH transfernodes/status", "PUT leases")
	read()
	if len(tn.Status.NICs) != 1 || tn.Status.NICs[0].State != "DOWN" {
		t.Errorf("NICs %+v, want mlx5_0 DOWN", tn.Status.NICs)
	}

	// The report deleted under the agent, and the Lease with it (garbage collection, which this test control
	// plane lacks, is done by hand): the round finds the Lease gone (an update of a missing Lease is a
	// conflict), then the report, reads the Node again and rewrites everything, all in one round.
	oldUID := tn.UID
	if err := admin.Delete(ctx, &tn); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: leaseKey.Namespace, Name: leaseKey.Name}}); err != nil {
		t.Fatal(err)
	}
	tick()
	round("report and lease gone", "PUT leases", "POST leases", "PATCH transfernodes/status",
		"GET nodes", "PATCH transfernodes", "PATCH transfernodes/status", "PUT leases")
	read()
	if tn.UID == oldUID || tn.Status.NICs[0].State != "DOWN" {
		t.Errorf("report uid %s (old %s) NICs %+v, want a new report with the current status", tn.UID, oldUID, tn.Status.NICs)
	}
	if err := admin.Get(ctx, leaseKey, &lease); err != nil || len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != tn.UID {
		t.Errorf("lease owners %+v (%v), want the new report %s", lease.OwnerReferences, err, tn.UID)
	}

	// Only the Lease deleted (by an admin): the round makes sure the report is there and creates the Lease.
	if err := admin.Delete(ctx, &lease); err != nil {
		t.Fatal(err)
	}
	at = tick()
	round("lease recreated", "PUT leases", "POST leases", "PATCH transfernodes/status", "PUT leases")
	renewedAt(at)
	// Someone else wrote the Lease: the renewal reads it and retries.
	lease.Spec.RenewTime = &metav1.MicroTime{Time: at.Add(time.Second)}
	if err := admin.Update(ctx, &lease); err != nil {
		t.Fatal(err)
	}
	at = tick()
	round("lease changed by someone else", "PUT leases", "POST leases", "GET leases", "PUT leases")
	renewedAt(at)
}

func TestRetryDelayBacksOffWithJitter(t *testing.T) {
	const p = 10 * time.Second
	for _, tc := range []struct {
		failures int
		jitter   float64
		want     time.Duration
	}{
		{1, 0.5, p}, {1, 0, p / 2}, {1, 0.999, 14990 * time.Millisecond},
		{2, 0.5, 2 * p}, {3, 0.5, 4 * p}, {30, 0.5, 4 * p}, {30, 0, 2 * p},
	} {
		if got := nodesync.RetryDelay(p, tc.failures, tc.jitter); got != tc.want {
			t.Errorf("RetryDelay(%s, %d, %g) = %s, want %s", p, tc.failures, tc.jitter, got, tc.want)
		}
	}
	// The first retry comes within the heartbeat timeout, whatever the jitter.
	if got := nodesync.RetryDelay(p, 1, 0.999999); got >= nodesync.LeaseTimeoutPeriods*p-p {
		t.Errorf("first retry after %s: a lease renewed one period before would expire first", got)
	}
}
