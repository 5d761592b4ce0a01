// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// TestDomainStatusFromHostileReportsIsOneTheAPIServerTakes: reports the TransferNode schema refuses now, but that
// were stored before it did (or get past it), reach the operator's aggregation: GPU indexes past 1023 or
// negative, one index twice, domain keys VPodTopology does not take, and more nodes in one domain than a status
// lists. Each used to go into the domain's status as it was, and the API server then refused every status write
// of that domain, so it froze (Ready, with members that had left) while the operator retried. The status built
// from them lists only what the schema takes, and a real API server accepts it (a dry-run update of a declared
// domain, so the running operator's writes are not disturbed).
func TestDomainStatusFromHostileReportsIsOneTheAPIServerTakes(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	const key = "ualink:5e1f0d2c-7a3b-4c8d-9e0f-00000000ba5e/9"
	hostile := append(gpusIn(key, 2000, -1, 3, 3, 1023), gpusIn("ualink:zz!/x", 4)...)
	nodes := []fxv1.TransferNode{
		{ObjectMeta: metav1.ObjectMeta{Name: "liar"}, Status: fxv1.TransferNodeStatus{GPUs: hostile}},
		{ObjectMeta: metav1.ObjectMeta{Name: "honest"}, Status: fxv1.TransferNodeStatus{GPUs: gpusIn(key, 0, 1)}},
	}
	for i := range fxv1.MaxVPodMembers + 5 {
		nodes = append(nodes, fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("z-crowd-%04d", i)},
			Status: fxv1.TransferNodeStatus{GPUs: gpusIn(key, 0)}})
	}
	domains := AggregateDomains(nodes, func(*fxv1.TransferNode) bool { return true })
	if _, ok := domains["ualink:zz!/x"]; ok {
		t.Error("a domain key VPodTopology does not take was aggregated")
	}
	obs := domains[key]
	if obs == nil {
		t.Fatalf("domain %s not aggregated", key)
	}
	if len(obs.Members) != fxv1.MaxVPodMembers || obs.Truncated != 7 {
		t.Errorf("%d members listed and %d left out, want %d and 7", len(obs.Members), obs.Truncated, fxv1.MaxVPodMembers)
	}
	i := slices.IndexFunc(obs.Members, func(m fxv1.VPodMember) bool { return m.Node == "honest" })
	if i < 0 || !slices.Equal(obs.Members[i].GPUs, []int32{0, 1}) {
		t.Errorf("the honest node's GPUs are not listed as it reported them (member %d)", i)
	}

	vp := &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: "hostile-reports"},
		Spec: fxv1.VPodTopologySpec{Kind: fxv1.FabricUALink, Domain: key, Members: []fxv1.VPodMember{{Node: "liar"}, {Node: "honest"}}}}
	if err := c.Create(ctx, vp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), vp) })
	liar := nodes[:200]
	for _, set := range [][]fxv1.TransferNode{nodes, liar} {
		obs := AggregateDomains(set, func(*fxv1.TransferNode) bool { return true })[key]
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the running operator writes its status too
			if err := c.Get(ctx, client.ObjectKeyFromObject(vp), vp); err != nil {
				return err
			}
			vp.Status = ComputeVPodStatus(vp, obs)
			return c.Status().Update(ctx, vp, client.DryRunAll)
		})
		if err != nil {
			t.Fatalf("the API server refused the status built from %d reports: %v", len(set), err)
		}
	}
	j := slices.IndexFunc(vp.Status.Members, func(m fxv1.VPodMember) bool { return m.Node == "liar" })
	if j < 0 || !slices.Equal(vp.Status.Members[j].GPUs, []int32{3, 1023}) {
		t.Errorf("the liar's member is %v, want its GPUs 3 and 1023 once each", vp.Status.Members[max(j, 0)])
	}
}

// collidingDomainKeys finds two UALink domain keys with one object name: the name keeps the key lowercased and
// 32 bits of its hash, and hex digits may be written in either case, so varying their case gives keys of one
// readable part, two of which meet after about 2^16 tries.
func collidingDomainKeys(t *testing.T) (string, string) {
	const ppod = "abcdefabcdefabcdefabcdefab"
	seen := map[string]string{}
	for v := range uint64(1) << len(ppod) {
		b := []byte(ppod)
		for i := range b {
			if v>>i&1 == 1 {
				b[i] -= 'a' - 'A'
			}
		}
		key := "ualink:" + string(b) + "/7"
		name := fxv1.DomainObjectName(key)
		if other, ok := seen[name]; ok {
			return other, key
		}
		seen[name] = key
	}
	t.Fatal("no two keys met")
	return "", ""
}

// TestDomainWhoseNameIsTakenLeavesTheOtherAlone: a node reports a domain whose object name is another domain's
// (found here as a node could: keys that differ in the case of their hex digits, about 2^16 hashes). The operator
// used to take the object that existed under the name for its own and patch its status with the second domain's
// members. It now leaves that object alone and says so with an Event on it.
func TestDomainWhoseNameIsTakenLeavesTheOtherAlone(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	victim, chosen := collidingDomainKeys(t)
	name := fxv1.DomainObjectName(victim)
	vp := &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: fxv1.VPodTopologySpec{Kind: fxv1.FabricUALink, Domain: victim, Members: []fxv1.VPodMember{{Node: "victim-node"}}}}
	if err := c.Create(ctx, vp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), vp) })
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	report(t, c, pool, "name-thief", time.Now(), gpusIn(chosen, 0, 1))
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "name-thief"}})
	})
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeWarning, EventDomainNameTaken, chosen, "name-thief")
	if err := c.Get(ctx, client.ObjectKeyFromObject(vp), vp); err != nil {
		t.Fatal(err)
	}
	if vp.Spec.Domain != victim || slices.ContainsFunc(vp.Status.Members, func(m fxv1.VPodMember) bool { return m.Node == "name-thief" }) {
		t.Fatalf("the victim domain's object took the other domain's report: spec %s, members %v", vp.Spec.Domain, vp.Status.Members)
	}
	// The second domain's reconcile used to find the victim's object among its own writes by name, find no
	// owner of its key in it, and panic (controller-runtime recovers and counts it).
	if n := promtest.Gather(t, ctrlmetrics.Registry)["controller_runtime_reconcile_panics_total{controller=vpodtopology}"]; n != 0 {
		t.Fatalf("the VPodTopology reconciler panicked %v times", n)
	}
}

// TestConditionMessagesAreBounded: a condition's message quoting what a tenant wrote (a DaemonSet error naming a
// 40,000-character field) was longer than the 32,768 bytes the API takes, so the status write failed and the
// condition never said anything. The operator cuts it, at a character boundary, saying how much it cut, and the
// real API server takes the write.
func TestConditionMessagesAreBounded(t *testing.T) {
	long := strings.Repeat("é", 20000) // 40,000 bytes of two-byte characters
	got := boundedMessage(long)
	if len(got) > maxConditionMessage || !utf8.ValidString(got) || !strings.Contains(got, "bytes more)") {
		t.Fatalf("bounded message: %d bytes, valid UTF-8 %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-32:])
	}
	if short := "agents rolled out"; boundedMessage(short) != short {
		t.Fatal("a short message was changed")
	}

	c := apiClient(t)
	ctx := context.Background()
	// It selects no node: a pool selecting every node would be served first there, and later pools of the suite
	// would run no agents.
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: newNamespace(t, c), Name: "long-message"},
		Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{"fabricxfer.test/none": "true"}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
	// The running operator writes the new pool's finalizers and conditions meanwhile: a conflict is retried.
	var wrote bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() (err error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		cond := metav1.Condition{Type: "LongMessageTest", Status: metav1.ConditionFalse, Reason: fxv1.ReasonReconcileError,
			Message: "applying the DaemonSet: " + strings.Repeat("k", 40000), ObservedGeneration: pool.Generation}
		_, wrote, err = setPoolCondition(ctx, c, c, pool, cond)
		return err
	})
	if err != nil || !wrote {
		t.Fatalf("writing a condition with a 40,000-byte message: wrote %v, %v", wrote, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	if stored := meta.FindStatusCondition(pool.Status.Conditions, "LongMessageTest"); stored == nil || len(stored.Message) > maxConditionMessage {
		t.Fatalf("stored condition %v", stored)
	}
}
