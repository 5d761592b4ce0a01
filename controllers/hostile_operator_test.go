// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// ownedObjects counts what the operator made for a pool anywhere: in the agents' namespace, the pool's
// namespace and cluster-wide.
func ownedObjects(t *testing.T, c client.Client, pool *fxv1.TransferPool) int {
	t.Helper()
	n := 0
	for _, list := range []client.ObjectList{&appsv1.DaemonSetList{}, &corev1.ServiceAccountList{}, &corev1.SecretList{},
		&rbacv1.RoleList{}, &rbacv1.RoleBindingList{}, &rbacv1.ClusterRoleBindingList{}} {
		if err := c.List(context.Background(), list, ownerLabels(pool)); err != nil {
			t.Fatal(err)
		}
		n += meta.LenList(list)
	}
	return n
}

// refusedSpec is a pool spec the CRD admits and the operator refuses, the condition reason it gets and what
// the condition's message must say.
type refusedSpec struct {
	name   string
	spec   fxv1.TransferPoolSpec
	reason string
	want   string
}

// refusedAgentSpecs are the agent values the operator refuses; nobody is a node selector that matches no node.
func refusedAgentSpecs(nobody map[string]string) []refusedSpec {
	return []refusedSpec{
		{"foreign-image", fxv1.TransferPoolSpec{NodeSelector: nobody, Agent: fxv1.AgentSpec{Image: "attacker.example/agent:v1"}},
			fxv1.ReasonImageNotAllowed, `spec.agent.image "attacker.example/agent:v1": not the operator's agent image`},
		{"bad-selector", fxv1.TransferPoolSpec{NodeSelector: map[string]string{"gpu": "-x-"}},
			fxv1.ReasonInvalidSpec, `spec.nodeSelector["gpu"] value "-x-"`},
		// Looks like the allowlisted agent-dev images, is another registry's.
		{"look-alike-image", fxv1.TransferPoolSpec{NodeSelector: nobody, Agent: fxv1.AgentSpec{Image: "example.com/agent-dev.evil.example/agent:v1"}},
			fxv1.ReasonImageNotAllowed, `spec.agent.image "example.com/agent-dev.evil.example/agent:v1"`},
		{"several-problems", fxv1.TransferPoolSpec{NodeSelector: map[string]string{"gpu": "_x"}, Agent: fxv1.AgentSpec{Image: "attacker.example/a:1"}},
			fxv1.ReasonImageNotAllowed, `spec.nodeSelector["gpu"] value "_x"`},
	}
}

// TestOperatorRefusesWhatAdmissionLets: an agent image the admin allowed runs. The pools the CRD accepts but the
// operator must not run (refusedAgentSpecs: images the admin did not allow, node selector values that are no
// label value) are tried by TestHostileAgentValuesAnsweredByAgentsReady, which checks both the pool's Ready
// and its AgentsReady condition.
func TestOperatorRefusesWhatAdmissionLets(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	// Pools of this test select no node, so they never contest the nodes of another test's pools.
	nobody := map[string]string{"fabricxfer.io/test-group": "refused-pools"}
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allowed-image"},
		Spec: fxv1.TransferPoolSpec{NodeSelector: nobody, Agent: fxv1.AgentSpec{Image: "example.com/agent-dev:abc"}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
	ds := &appsv1.DaemonSet{}
	eventually(t, settle, "the allowed image's DaemonSet", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: agentName(pool)}, ds)
	})
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != "example.com/agent-dev:abc" {
		t.Errorf("image %q, want the pool's allowed one", got)
	}
}

// TestCollidingPoolNamesKeepTheirObjects: team/a-x and team-a/x once shared a ClusterRole, and deleting one
// pool removed the other's cluster permissions. Each must keep its own objects through the other's deletion.
func TestCollidingPoolNamesKeepTheirObjects(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	team := "team-" + rand.String(5)
	var pools []*fxv1.TransferPool
	for _, p := range []struct{ ns, name string }{{team, "a-x"}, {team + "-a", "x"}} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.ns}}); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, newPool(t, c, p.ns, p.name, "collide-"+p.ns))
	}
	const perPool = 7 // DaemonSet, ServiceAccount, two Secrets, Role, RoleBinding, ClusterRoleBinding
	for _, p := range pools {
		eventually(t, settle, "every object of "+p.Namespace+"/"+p.Name, func() error {
			if n := ownedObjects(t, c, p); n != perPool {
				return fmt.Errorf("%d objects, want %d", n, perPool)
			}
			return nil
		})
	}
	if err := c.Delete(ctx, pools[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "the deleted pool's objects gone", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pools[0]), &fxv1.TransferPool{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pool still there: %v", err)
		}
		if n := ownedObjects(t, c, pools[0]); n != 0 { // no garbage collector here: the finalizer deletes all
			return fmt.Errorf("%d objects left", n)
		}
		return nil
	})
	if n := ownedObjects(t, c, pools[1]); n != perPool {
		t.Errorf("the other pool has %d objects after its look-alike was deleted, want %d", n, perPool)
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(ctx, client.ObjectKey{Name: agentName(pools[1])}, crb); err != nil {
		t.Errorf("the other pool's ClusterRoleBinding: %v", err)
	}
}
