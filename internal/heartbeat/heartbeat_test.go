// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package heartbeat

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Only a renewal of a still valid Lease is a non-event; any other change can flip a node.
func TestRenewalChangesFreshness(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	lease := func(holder string, renewedAgo time.Duration, seconds int32) *coordinationv1.Lease {
		renew := metav1.NewMicroTime(now.Add(-renewedAgo))
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: holder, Labels: map[string]string{fxv1.LabelPoolName: "p"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew, LeaseDurationSeconds: &seconds},
		}
	}
	cases := []struct {
		name     string
		old, new *coordinationv1.Lease
		want     bool
	}{
		{"renewal of a valid lease", lease("n", 10*time.Second, 30), lease("n", 0, 30), false},
		{"renewal just before expiry", lease("n", 29*time.Second, 30), lease("n", 0, 30), false},
		{"renewal of an expired lease", lease("n", 30*time.Second, 30), lease("n", 0, 30), true},
		{"renewal moved back", lease("n", 0, 30), lease("n", time.Hour, 30), true},
		{"another holder", lease("n", time.Second, 30), lease("m", 0, 30), true},
		{"another duration", lease("n", time.Second, 30), lease("n", 0, 6), true},
	}
	for _, tc := range cases {
		if got := RenewalChangesFreshness(tc.old, tc.new, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	noRenew := lease("n", 0, 30)
	noRenew.Spec.RenewTime = nil
	if !RenewalChangesFreshness(noRenew, lease("n", 0, 30), now) {
		t.Error("a first renewal must count")
	}
}

// A node's heartbeat is the later of its Lease and its report; a Lease of another pool, or one without a
// holder or renewal, counts for nothing, and a hostile Lease that names the pool cannot make another pool's
// report fresh.
func TestLastAndFresh(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: fxv1.TransferNodeSpec{NodeName: "n", PoolNamespace: "ns", PoolName: "p"}}
	tn.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-time.Minute)}
	lease := func(ns, pool, holder string, ago time.Duration) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder, Labels: map[string]string{fxv1.LabelPoolName: pool}}}
		if holder != "" {
			l.Spec.HolderIdentity = &holder
		}
		if ago >= 0 {
			r := metav1.NewMicroTime(now.Add(-ago))
			l.Spec.RenewTime = &r
		}
		return l
	}
	beats := Beats{}
	beats.Add(lease("other-ns", "p", "n", 0)) // same pool name, another namespace
	beats.Add(lease("ns", "other", "n", 0))   // another pool
	beats.Add(lease("ns", "p", "", 0))        // no holder
	beats.Add(lease("ns", "p", "n", -1))      // never renewed
	beats.Add(lease("ns", "", "n", 0))        // not an agent's Lease
	if got := beats.Last(tn); !got.Equal(now.Add(-time.Minute)) {
		t.Fatalf("Last = %s, want the report's own heartbeat: no Lease above is this agent's", got)
	}
	if beats.Fresh(tn, now, Timeout(10)) {
		t.Fatal("a report a minute old is fresh under a 30 s timeout")
	}
	beats.Add(lease("ns", "p", "n", 5*time.Second))
	beats.Add(lease("ns", "p", "n", 20*time.Second)) // an older copy does not move the heartbeat back
	if got := beats.Last(tn); !got.Equal(now.Add(-5 * time.Second)) {
		t.Fatalf("Last = %s, want the Lease's renewal", got)
	}
	if !beats.Fresh(tn, now, Timeout(10)) || beats.Fresh(tn, now, 5*time.Second) {
		t.Fatal("freshness does not follow the timeout")
	}
	// A beat dated ahead of now counts only while it is less than a timeout ahead: a report a node wrote a
	// century ahead would keep it fresh until then, dead or not. One further ahead is left out, so the Lease's
	// renewal 5 s ago still decides (a report written while the node's clock ran ahead must not hide it), and
	// without a Lease nothing is fresh.
	for _, ahead := range []time.Duration{time.Second, 29 * time.Second, 30 * time.Second, 100 * 365 * 24 * time.Hour} {
		late := tn.DeepCopy()
		late.Status.LastHeartbeat = &metav1.Time{Time: now.Add(ahead)}
		counted := ahead < Timeout(10)
		if got := beats.Fresh(late, now, Timeout(10)); !got {
			t.Errorf("a report %s ahead hid the Lease renewed 5 s ago", ahead)
		}
		if got, want := beats.LastAt(late, now, Timeout(10)).Equal(now.Add(ahead)), counted; got != want {
			t.Errorf("a report %s ahead: counted %v, want %v", ahead, got, want)
		}
		if got, want := (Beats{}).Fresh(late, now, Timeout(10)), counted; got != want {
			t.Errorf("a report %s ahead and no Lease: fresh %v, want %v", ahead, got, want)
		}
	}
	century := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", Labels: map[string]string{fxv1.LabelPoolName: "p"}}}
	holder, renew := "n", metav1.NewMicroTime(now.Add(100*365*24*time.Hour))
	century.Spec.HolderIdentity, century.Spec.RenewTime = &holder, &renew
	stale := tn.DeepCopy()
	stale.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-time.Hour)}
	forged := Beats{}
	forged.Add(century)
	if forged.Fresh(stale, now, Timeout(10)) {
		t.Error("a Lease renewed a century ahead kept a node an hour silent fresh")
	}
	if Timeout(0) != 30*time.Second || Timeout(-4) != 30*time.Second || Timeout(2) != 6*time.Second {
		t.Fatalf("Timeout: %s %s %s", Timeout(0), Timeout(-4), Timeout(2))
	}
	if !IsAgentLease(lease("ns", "p", "n", 0)) || IsAgentLease(lease("ns", "", "n", 0)) || IsAgentLease(tn) {
		t.Fatal("IsAgentLease must pass only Leases carrying the pool label")
	}
}
