// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/topology"
)

// declaredPeriod is the heartbeat of the declaration tests.
const declaredPeriod = time.Second

// declaredAgent is an agent whose detection takes the declarations its filtered watch keeps.
type declaredAgent struct {
	name    string
	watch   *nodesync.DeclarationWatch
	urls    *urlLog
	fixture string
}

func startDeclaredAgent(ctx context.Context, t *testing.T, cfg *rest.Config, admin client.Client, name, fixture, override string) *declaredAgent {
	t.Helper()
	if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	urls := &urlLog{}
	agentCfg := rest.CopyConfig(cfg)
	agentCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { urls.next = rt; return urls })
	c, err := client.NewWithWatch(agentCfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	host, err := topology.NewDirHost(filepath.Join(repoRoot, "topology", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	a := &declaredAgent{name: name, urls: urls, fixture: fixture,
		watch: nodesync.NewDeclarationWatch(c, name, testr.New(t).WithValues("declarations", name))}
	r, err := nodesync.New(nodesync.Config{
		NodeName: name, PoolNamespace: "inference", PoolName: "kv", Period: declaredPeriod,
		Identity: nodestatus.Identity{AgentVersion: "test"},
		Detect: func(ctx context.Context) (topology.Report, error) {
			return topology.Detect(ctx, host, topology.Options{Declarations: a.watch.Declarations(),
				Overrides: topology.Overrides{FabricDomain: override}})
		},
		Client: c,
		Log:    testr.New(t).WithValues("node", name),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { _ = a.watch.Run(ctx); done <- struct{}{} }()
	go func() { _ = r.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		for range 2 {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("agent %s did not stop within 10 s", name)
				return
			}
		}
	})
	return a
}

func declare(name, domain string, members ...v1alpha1.VPodMember) *v1alpha1.VPodTopology {
	kind, _ := v1alpha1.DomainKind(domain)
	return &v1alpha1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VPodTopologySpec{Kind: kind, Domain: domain, Members: members}}
}

func member(node string, gpus ...int32) v1alpha1.VPodMember {
	return v1alpha1.VPodMember{Node: node, GPUs: gpus}
}

// fabricOf lists each GPU of a report as domain/source/declaration.
func fabricOf(tn *v1alpha1.TransferNode) []string {
	var out []string
	for _, g := range tn.Status.GPUs {
		if g.Fabric == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s/%s", g.Fabric.Domain, g.Fabric.Source, g.Fabric.Declaration))
	}
	return out
}

// gpuDesc is GPU memory on a reported GPU as the agent registers it (fabric-exportable), for the routing rule.
func gpuDesc(tn *v1alpha1.TransferNode, gpu int) engines.MemoryDesc {
	d := engines.MemoryDesc{ID: engines.MemoryID(fmt.Sprintf("%s/gpu%d", tn.Name, gpu)), Node: tn.Name, Size: 1 << 20,
		Location: engines.Location{Kind: engines.LocationGPU, Device: gpu, Vendor: engines.VendorAMD},
		Handles:  engines.Handles{Fabric: &engines.FabricHandle{}}}
	if f := tn.Status.GPUs[gpu].Fabric; f != nil {
		d.FabricDomain = f.Domain
	}
	return d
}

// TestDeclaredVPodsOnARealAPIServer: agents put declared GPUs into their domains GPU by GPU, from a watch that
// receives only their own node's declarations (100 other vPODs exist); the hardware wins over a declaration
// that disagrees, a GPU stays in the first declaration that names it, the pool's override refuses
// declarations, each conflict shows in the VPodTopology's Declared condition, the fabric rule pairs GPUs of
// one declared vPOD only, and a removed declaration leaves the node within one heartbeat.
func TestDeclaredVPodsOnARealAPIServer(t *testing.T) {
	cfg, admin := startEnv(t, false)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	createNamespace(t, admin, "inference")
	rec := &controllers.VPodTopologyReconciler{Client: admin, Clock: clock.RealClock{}}
	reconcile := func() {
		t.Helper()
		if _, err := rec.Reconcile(ctx, ctrl.Request{}); err != nil {
			t.Logf("reconcile: %v", err)
		}
	}

	// 100 vPODs of other nodes, declared and labelled before the agents start.
	for i := range 100 {
		vp := declare(fmt.Sprintf("other-%03d", i), fmt.Sprintf("ualink:55/%d", i), member(fmt.Sprintf("other-node-%03d", i)))
		if err := admin.Create(ctx, vp); err != nil {
			t.Fatal(err)
		}
	}
	const left, right, hwConflict = "ualink:77/1", "ualink:77/2", "ualink:77/3"
	hwKey := "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1"
	for _, vp := range []*v1alpha1.VPodTopology{
		declare("vpod-left", left, member("node-a", 0, 1, 2, 3), member("node-b", 0, 1, 2, 3)),
		declare("vpod-right", right, member("node-a", 4, 5, 6, 7), member("node-b", 4, 5, 6, 7)),
	} {
		if err := admin.Create(ctx, vp); err != nil {
			t.Fatal(err)
		}
	}
	// Created later, so vpod-left keeps node-a's GPU 0; node-hw's hardware reports hwKey; node-o's pool pins.
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a resolution of one second
	if err := admin.Create(ctx, declare("vpod-late", hwConflict, member("node-hw"), member("node-a", 0, 1000), member("node-o"))); err != nil {
		t.Fatal(err)
	}
	reconcile() // member labels
	// Labelled for node-a without naming it (after the operator's pass, which would correct the labels): the
	// label selects, the spec decides.
	forged := declare("forged", "ualink:77/9", member("node-b", 7))
	forged.Labels = map[string]string{v1alpha1.MemberLabel("node-a"): "true"}
	if err := admin.Create(ctx, forged); err != nil {
		t.Fatal(err)
	}

	agents := map[string]*declaredAgent{}
	for _, n := range []struct{ name, fixture, override string }{
		{"node-a", "mi300x-8gpu-roce", ""}, {"node-b", "mi300x-8gpu-roce", ""},
		{"node-hw", "ualink-vpod-node-a", ""}, {"node-o", "mi300x-8gpu-roce", "ualink:42/7"},
	} {
		agents[n.name] = startDeclaredAgent(ctx, t, cfg, admin, n.name, n.fixture, n.override)
	}
	get := func(node string) *v1alpha1.TransferNode {
		var tn v1alpha1.TransferNode
		if err := admin.Get(ctx, client.ObjectKey{Name: node}, &tn); err != nil {
			return nil
		}
		return &tn
	}
	want := map[string]string{
		"node-a": "[ualink:77/1/declared/vpod-left ualink:77/1/declared/vpod-left ualink:77/1/declared/vpod-left ualink:77/1/declared/vpod-left " +
			"ualink:77/2/declared/vpod-right ualink:77/2/declared/vpod-right ualink:77/2/declared/vpod-right ualink:77/2/declared/vpod-right]",
		"node-hw": fmt.Sprint([]string{hwKey + "/discovered/", hwKey + "/discovered/", hwKey + "/discovered/", hwKey + "/discovered/"}),
		"node-o":  "[ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/ ualink:42/7/override/]",
	}
	waitFor(t, 15*time.Second, "every agent reports its declared domains", func() (bool, error) {
		for node, w := range want {
			tn := get(node)
			if tn == nil || fmt.Sprint(fabricOf(tn)) != w {
				return false, fmt.Errorf("%s: %v", node, tn)
			}
		}
		return true, nil
	})

	t.Run("the watch is filtered", func(t *testing.T) {
		// Every other vPOD written once more, then one of node-a's: once that event arrived, the others' would
		// have arrived before it had the watch not been filtered.
		before := agents["node-a"].watch.Received()
		for i := range 100 {
			var vp v1alpha1.VPodTopology
			if err := admin.Get(ctx, client.ObjectKey{Name: fmt.Sprintf("other-%03d", i)}, &vp); err != nil {
				t.Fatal(err)
			}
			vp.Labels["touched"] = "1"
			if err := admin.Update(ctx, &vp); err != nil {
				t.Fatal(err)
			}
		}
		var marker v1alpha1.VPodTopology
		if err := admin.Get(ctx, client.ObjectKey{Name: "vpod-late"}, &marker); err != nil {
			t.Fatal(err)
		}
		marker.Annotations = map[string]string{"marker": "last"}
		if err := admin.Update(ctx, &marker); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "node-a sees the marker", func() (bool, error) { return agents["node-a"].watch.Received() > before, nil })
		time.Sleep(200 * time.Millisecond)
		if got := agents["node-a"].watch.Received() - before; got != 1 {
			t.Errorf("node-a's watch received %d objects for 100 other vPODs and one of its own written", got)
		}
		for name, a := range agents {
			// Its own declarations, their label patch and a status patch or two; never the 100 others.
			if got := a.watch.Received(); got > 12 {
				t.Errorf("%s's declaration watch received %d objects with 100 other vPODs in the cluster", name, got)
			}
			for _, u := range a.urls.all() {
				if strings.Contains(u, "/vpodtopologies") && !strings.Contains(u, "labelSelector="+strings.ReplaceAll(v1alpha1.MemberLabel(name), "/", "%2F")) {
					t.Errorf("%s read VPodTopologies without its member label: %s", name, u)
				}
			}
			t.Logf("%s received %d VPodTopologies", name, a.watch.Received())
		}
	})

	t.Run("side by side in the TransferNode", func(t *testing.T) {
		decls := map[string]v1alpha1.FabricDeclaration{}
		for _, node := range []string{"node-a", "node-hw", "node-o"} {
			for _, d := range get(node).Status.Declarations {
				decls[node+"/"+d.VPodTopology] = d
			}
		}
		if d := decls["node-a/vpod-late"]; len(d.GPUs) != 0 || d.Refused != "GPU 0: declared in ualink:77/1 by vpod-left first; GPU 1000: not on this node (8 GPUs)" {
			t.Errorf("node-a's record of vpod-late: %+v", d)
		}
		if d := decls["node-hw/vpod-late"]; len(d.GPUs) != 0 || d.Refused != "GPUs 0-3: the hardware reports "+hwKey {
			t.Errorf("node-hw's record of vpod-late: %+v", d)
		}
		if d := decls["node-o/vpod-late"]; !strings.Contains(d.Refused, "fabricDomainOverride") {
			t.Errorf("node-o's record of vpod-late: %+v", d)
		}
		if _, ok := decls["node-a/forged"]; ok {
			t.Error("node-a took a declaration that does not name it")
		}
		for _, d := range agents["node-a"].watch.Declarations() {
			if d.Name == "forged" {
				t.Error("node-a's watch turned a VPodTopology that does not name it into a declaration")
			}
		}
	})

	t.Run("conditions name the conflicts", func(t *testing.T) {
		var late, leftVP v1alpha1.VPodTopology
		waitFor(t, 10*time.Second, "Declared conditions", func() (bool, error) {
			reconcile()
			if err := admin.Get(ctx, client.ObjectKey{Name: "vpod-late"}, &late); err != nil {
				return false, err
			}
			if err := admin.Get(ctx, client.ObjectKey{Name: "vpod-left"}, &leftVP); err != nil {
				return false, err
			}
			c, l := meta.FindStatusCondition(late.Status.Conditions, v1alpha1.ConditionDeclared), meta.FindStatusCondition(leftVP.Status.Conditions, v1alpha1.ConditionDeclared)
			return c != nil && c.Reason == v1alpha1.ReasonDeclarationConflict && l != nil && l.Status == metav1.ConditionTrue,
				fmt.Errorf("vpod-late %+v, vpod-left %+v", c, l)
		})
		msg := meta.FindStatusCondition(late.Status.Conditions, v1alpha1.ConditionDeclared).Message
		for _, want := range []string{"node-hw: GPUs 0-3: the hardware reports " + hwKey, "node-a: GPU 0: declared in ualink:77/1 by vpod-left first", "node-o: ", "fabricDomainOverride"} {
			if !strings.Contains(msg, want) {
				t.Errorf("vpod-late's Declared message %q lacks %q", msg, want)
			}
		}
		if fmt.Sprint(leftVP.Status.Members) != "[{node-a [0 1 2 3]} {node-b [0 1 2 3]}]" || leftVP.Status.GPUs != 8 {
			t.Errorf("vpod-left members %v gpus %d", leftVP.Status.Members, leftVP.Status.GPUs)
		}
	})

	t.Run("the fabric rule pairs GPUs of one declared vPOD", func(t *testing.T) {
		a, b := get("node-a"), get("node-b")
		for _, c := range []struct {
			ga, gb int
			fabric bool
		}{{1, 2, true}, {5, 7, true}, {1, 5, false}, {6, 0, false}} {
			src, dst := gpuDesc(a, c.ga), gpuDesc(b, c.gb)
			ok, why := fabric.Claims("node-a", &src, &dst)
			if ok != c.fabric {
				t.Errorf("node-a GPU %d -> node-b GPU %d: fabric %v (%s), want %v", c.ga, c.gb, ok, why, c.fabric)
			}
		}
	})

	t.Run("the API refuses garbage in the new fields", func(t *testing.T) {
		before := get("node-a")
		tn := &v1alpha1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "garbage"}, Spec: v1alpha1.TransferNodeSpec{NodeName: "garbage"}}
		if err := admin.Create(ctx, tn); err != nil {
			t.Fatal(err)
		}
		many := make([]v1alpha1.FabricDeclaration, 17)
		for i := range many {
			many[i] = v1alpha1.FabricDeclaration{VPodTopology: fmt.Sprint("v", i), Domain: left}
		}
		for _, c := range []struct {
			name string
			st   v1alpha1.TransferNodeStatus
			want string
		}{
			{"unknown source", v1alpha1.TransferNodeStatus{GPUs: []v1alpha1.GPU{{Vendor: v1alpha1.VendorAMD, PCIBusID: "0000:01:00.0",
				Fabric: &v1alpha1.FabricMembership{Kind: v1alpha1.FabricUALink, Domain: left, Source: "trust-me"}}}}, `Unsupported value: "trust-me"`},
			{"too many declarations", v1alpha1.TransferNodeStatus{Declarations: many}, "must have at most 16 items"},
			{"endless refusal", v1alpha1.TransferNodeStatus{Declarations: []v1alpha1.FabricDeclaration{{VPodTopology: "v", Domain: left,
				Refused: strings.Repeat("x", 513)}}}, "may not be more than 512"},
			{"too many GPUs", v1alpha1.TransferNodeStatus{Declarations: []v1alpha1.FabricDeclaration{{VPodTopology: "v", Domain: left,
				GPUs: make([]int32, 65)}}}, "must have at most 64 items"},
		} {
			tn.Status = c.st
			if err := admin.Status().Update(ctx, tn); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
			}
		}
		if after := get("node-a"); fmt.Sprint(fabricOf(after)) != fmt.Sprint(fabricOf(before)) {
			t.Errorf("node-a's report changed: %v -> %v", fabricOf(before), fabricOf(after))
		}
	})

	t.Run("removing a declaration removes the domain within one heartbeat", func(t *testing.T) {
		// node-b leaves vpod-left: its agent reads the spec, the member label has not even been removed yet.
		var vp v1alpha1.VPodTopology
		if err := admin.Get(ctx, client.ObjectKey{Name: "vpod-left"}, &vp); err != nil {
			t.Fatal(err)
		}
		vp.Spec.Members = vp.Spec.Members[:1]
		if err := admin.Update(ctx, &vp); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, declaredPeriod+500*time.Millisecond, "node-b's GPUs 0-3 out of vpod-left", func() (bool, error) {
			tn := get("node-b")
			return tn != nil && tn.Status.GPUs[0].Fabric == nil && tn.Status.GPUs[3].Fabric == nil && tn.Status.GPUs[4].Fabric != nil, nil
		})
		t.Logf("a member removed from the spec left node-b's report after %s", took.Round(time.Millisecond))
		if err := admin.Delete(ctx, declare("vpod-right", right)); err != nil {
			t.Fatal(err)
		}
		took = waitFor(t, declaredPeriod+500*time.Millisecond, "node-a's GPUs 4-7 out of the deleted vpod-right", func() (bool, error) {
			tn := get("node-a")
			return tn != nil && tn.Status.GPUs[4].Fabric == nil && tn.Status.GPUs[7].Fabric == nil && tn.Status.GPUs[0].Fabric != nil, nil
		})
		t.Logf("a deleted declaration left node-a's report after %s", took.Round(time.Millisecond))
		reconcile()
		if err := admin.Get(ctx, client.ObjectKey{Name: "vpod-left"}, &vp); err != nil {
			t.Fatal(err)
		}
		if vp.Labels[v1alpha1.MemberLabel("node-b")] != "" || vp.Labels[v1alpha1.MemberLabel("node-a")] != "true" {
			t.Errorf("vpod-left's labels after node-b left: %v", vp.Labels)
		}
	})
}
