// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// ownPeriod is the heartbeat of the tests of the own-status watch: short, so "within one heartbeat" is quick.
const ownPeriod = 2 * time.Second

// urlLog records the URLs (path and query) of the requests a client sends.
type urlLog struct {
	mu   sync.Mutex
	next http.RoundTripper
	urls []string
}

func (l *urlLog) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.urls = append(l.urls, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	l.mu.Unlock()
	return l.next.RoundTrip(r)
}

func (l *urlLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.urls...)
}

// ownAgent is a running agent with a watching client of its own, on a node created for it.
type ownAgent struct {
	r      *nodesync.Reporter
	urls   *urlLog
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// startOwnAgent creates the Node and runs a reporter for it that watches its own TransferNode.
func startOwnAgent(t *testing.T, cfg *rest.Config, admin client.Client, nodeName string) *ownAgent {
	t.Helper()
	if err := admin.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}); err != nil {
		t.Fatalf("creating Node %s: %v", nodeName, err)
	}
	createNamespace(t, admin, "inference")
	urls := &urlLog{}
	agentCfg := rest.CopyConfig(cfg)
	agentCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { urls.next = rt; return urls })
	c, err := client.NewWithWatch(agentCfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := nodesync.New(nodesync.Config{
		NodeName: nodeName, PoolNamespace: "inference", PoolName: "kv", Period: ownPeriod,
		Identity: nodestatus.Identity{AgentVersion: "v-test", Endpoint: "10.0.0.7:7470"},
		Detect: func(context.Context) (topology.Report, error) {
			return topology.Report{NICs: []topology.NIC{{Name: "mlx5_0", Port: 1, State: "ACTIVE", LinkLayer: "Ethernet"}}}, nil
		},
		Client: c,
		Watch:  c,
		Log:    testr.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	a := &ownAgent{r: r, urls: urls, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := a.stop(); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, 10*time.Second, "first report", func() (bool, error) {
		var tn v1alpha1.TransferNode
		err := admin.Get(t.Context(), client.ObjectKey{Name: nodeName}, &tn)
		return err == nil && tn.Status.Endpoint == "10.0.0.7:7470" && r.StatusWrites() > 0 && r.Watching(), err
	})
	return a
}

// stop cancels the agent and waits, with a deadline, for Run to return; it returns Run's result.
func (a *ownAgent) stop() error {
	a.once.Do(func() {
		a.cancel()
		select {
		case a.err = <-a.done:
		case <-time.After(5 * time.Second):
			a.err = errors.New("reporter Run did not return within 5s of cancel")
		}
	})
	return a.err
}

// TestAgentRestoresItsStatus: an admin forges the endpoint and the agent version; the agent writes both back
// within one heartbeat. An admin adding a field the agent leaves empty (registered bytes) is undone too.
func TestAgentRestoresItsStatus(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	a := startOwnAgent(t, cfg, admin, "owned")

	var tn v1alpha1.TransferNode
	if err := admin.Get(ctx, client.ObjectKey{Name: "owned"}, &tn); err != nil {
		t.Fatal(err)
	}
	tn.Status.Endpoint = "203.0.113.66:7470"
	tn.Status.AgentVersion = "forged"
	tn.Status.RegisteredBytes = 12345
	if err := admin.Status().Update(ctx, &tn); err != nil {
		t.Fatalf("forging the status: %v", err)
	}
	took := waitFor(t, ownPeriod, "forged status written back", func() (bool, error) {
		err := admin.Get(ctx, client.ObjectKey{Name: "owned"}, &tn)
		return err == nil && tn.Status.Endpoint != "203.0.113.66:7470" && tn.Status.AgentVersion != "forged" &&
			tn.Status.RegisteredBytes == 0, err
	})
	t.Logf("status restored after %s (heartbeat %s)", took.Round(time.Millisecond), ownPeriod)
	if tn.Status.Endpoint != "10.0.0.7:7470" || tn.Status.AgentVersion != "v-test" || tn.Status.RegisteredBytes != 0 {
		t.Errorf("restored endpoint %q version %q registered %d, want 10.0.0.7:7470, v-test, 0",
			tn.Status.Endpoint, tn.Status.AgentVersion, tn.Status.RegisteredBytes)
	}
	if len(tn.Status.NICs) != 1 || tn.Status.NICs[0].Name != "mlx5_0" {
		t.Errorf("restored NICs %+v, want mlx5_0", tn.Status.NICs)
	}
	if got := a.r.Rewrites(); got != 1 {
		t.Errorf("rewrites %d, want 1", got)
	}

	// Settled: the agent's own writes do not set it off again.
	version := tn.ResourceVersion
	time.Sleep(2 * ownPeriod)
	if err := admin.Get(ctx, client.ObjectKey{Name: "owned"}, &tn); err != nil || tn.ResourceVersion != version {
		t.Errorf("resourceVersion %s -> %s (%v) after the restore; want no further write", version, tn.ResourceVersion, err)
	}
	if got := a.r.Rewrites(); got != 1 {
		t.Errorf("rewrites %d after settling, want 1", got)
	}

	// Deleted: the agent writes the object again, without waiting for its next round to stumble on it.
	oldUID := tn.UID
	if err := admin.Delete(ctx, &tn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ownPeriod, "TransferNode written again after deletion", func() (bool, error) {
		err := admin.Get(ctx, client.ObjectKey{Name: "owned"}, &tn)
		if apierrors.IsNotFound(err) {
			return false, err
		}
		return err == nil && tn.UID != oldUID && tn.Status.Endpoint == "10.0.0.7:7470" && tn.Spec.NodeName == "owned", err
	})
}

// TestAgentIgnoresChangesItDoesNotOwn: labels and annotations an admin adds are not the agent's; its status
// is not written again over two heartbeats.
func TestAgentIgnoresChangesItDoesNotOwn(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	a := startOwnAgent(t, cfg, admin, "labelled")
	writes, events := a.r.StatusWrites(), a.r.WatchEvents()
	var tn v1alpha1.TransferNode
	if err := admin.Get(ctx, client.ObjectKey{Name: "labelled"}, &tn); err != nil {
		t.Fatal(err)
	}
	beat := tn.Status.LastHeartbeat
	patch := []byte(`{"metadata":{"labels":{"team":"infra"},"annotations":{"note":"checked"}}}`)
	if err := admin.Patch(ctx, &tn, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ownPeriod, "label event seen by the agent", func() (bool, error) {
		return a.r.WatchEvents() > events, nil
	})
	time.Sleep(2 * ownPeriod)
	if got := a.r.StatusWrites(); got != writes {
		t.Errorf("status writes %d -> %d after a label change; want none", writes, got)
	}
	if got := a.r.Rewrites(); got != 0 {
		t.Errorf("rewrites %d, want 0", got)
	}
	if err := admin.Get(ctx, client.ObjectKey{Name: "labelled"}, &tn); err != nil {
		t.Fatal(err)
	}
	if !tn.Status.LastHeartbeat.Equal(beat) || tn.Labels["team"] != "infra" {
		t.Errorf("lastHeartbeat %s -> %s, label %q: want the status untouched and the label kept", beat, tn.Status.LastHeartbeat, tn.Labels["team"])
	}
}

// TestAgentWatchIsFiltered: with 50 other TransferNodes written over and over, the agent's watch receives
// only its own object's events, and it never lists or watches TransferNodes without the name selector.
func TestAgentWatchIsFiltered(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	a := startOwnAgent(t, cfg, admin, "filtered")
	before := a.r.WatchEvents()

	const others, rounds = 50, 3
	for i := range others {
		name := fmt.Sprintf("other-%02d", i)
		tn := &v1alpha1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.TransferNodeSpec{NodeName: name}}
		if err := admin.Create(ctx, tn); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		for j := range rounds {
			tn.Status.Endpoint = fmt.Sprintf("10.1.%d.%d:7470", i, j)
			if err := admin.Status().Update(ctx, tn); err != nil {
				t.Fatalf("updating %s: %v", name, err)
			}
		}
	}
	// One more write of the agent's own object, after all of the others: once its event arrived, the others'
	// would have arrived before it had the watch not been filtered.
	var own v1alpha1.TransferNode
	if err := admin.Get(ctx, client.ObjectKey{Name: "filtered"}, &own); err != nil {
		t.Fatal(err)
	}
	own.Annotations = map[string]string{"marker": "last"}
	if err := admin.Update(ctx, &own); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ownPeriod, "own marker event", func() (bool, error) { return a.r.WatchEvents() > before, nil })
	time.Sleep(ownPeriod / 2)
	if got := a.r.WatchEvents() - before; got != 1 {
		t.Errorf("the agent's watch received %d events while %d other TransferNodes were written %d times each; want 1 (its own)",
			got, others, rounds+1)
	}
	for _, u := range a.urls.all() {
		if !strings.Contains(u, "/transfernodes") || strings.Contains(u, "/transfernodes/") || !strings.HasPrefix(u, "GET ") {
			continue // not a list or watch of TransferNodes
		}
		if !strings.Contains(u, "fieldSelector=metadata.name%3Dfiltered") {
			t.Errorf("request %s lists or watches TransferNodes without selecting the own one by name", u)
		}
	}
}

// TestAgentStopsCleanly: after cancel, Run returns and no goroutine of the reporter (its watch included) is
// left.
func TestAgentStopsCleanly(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	a := startOwnAgent(t, cfg, admin, "stopping")
	if err := a.stop(); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		left := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			// The reporter's own goroutines, and client-go's goroutine that decodes a watch stream.
			if strings.Contains(g, "agent/nodesync.(*Reporter)") || strings.Contains(g, "watch.(*StreamWatcher)") {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reporter goroutines left 5s after Run returned:\n%s", left, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentDoesNotFightAtWatchSpeed: another writer forges the endpoint over and over for two heartbeats; the
// agent writes back at most twice a heartbeat (plus its periodic round) rather than once per event, and has
// the last word within one heartbeat after the other writer stops.
func TestAgentDoesNotFightAtWatchSpeed(t *testing.T) {
	cfg, admin := startEnv(t, false, transferNodeCRD)
	ctx := t.Context()
	a := startOwnAgent(t, cfg, admin, "fought")
	writes := a.r.StatusWrites()
	forged := 0
	for start := time.Now(); time.Since(start) < 2*ownPeriod; {
		var tn v1alpha1.TransferNode
		if err := admin.Get(ctx, client.ObjectKey{Name: "fought"}, &tn); err != nil {
			t.Fatal(err)
		}
		tn.Status.Endpoint = fmt.Sprintf("203.0.113.%d:7470", forged%250)
		if err := admin.Status().Update(ctx, &tn); err == nil {
			forged++
		} else if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := a.r.StatusWrites() - writes
	t.Logf("%d forged writes, %d write-backs in %s", forged, got, 2*ownPeriod)
	// Two heartbeats: at most two write-backs each, and a periodic round each, with slack for where the rounds fall.
	if got > 9 {
		t.Errorf("%d status writes while another writer forged the endpoint %d times in two heartbeats; want at most 9", got, forged)
	}
	if forged < 20 {
		t.Errorf("only %d forged writes: the test did not make the agent fight", forged)
	}
	waitFor(t, ownPeriod+time.Second, "endpoint restored after the fight", func() (bool, error) {
		var tn v1alpha1.TransferNode
		err := admin.Get(ctx, client.ObjectKey{Name: "fought"}, &tn)
		return err == nil && tn.Status.Endpoint == "10.0.0.7:7470", err
	})
}
