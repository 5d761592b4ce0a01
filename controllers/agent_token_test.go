// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// agentClient is a client with the token a pool's agent pod on node gets: its ServiceAccount's token bound to
// a Pod scheduled there, which is what carries the node name the API server adds to the caller.
func agentClient(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string) client.Client {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{}
	key := client.ObjectKey{Namespace: testAgentNamespace, Name: agentName(pool)}
	eventually(t, settle, "the pool's agent ServiceAccount and bindings", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: agentName(pool)}, &rbacv1.ClusterRoleBinding{}); err != nil {
			return err
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: agentName(pool)}, &rbacv1.RoleBinding{}); err != nil {
			return err
		}
		return c.Get(ctx, key, sa)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNamespace, GenerateName: "agent-"},
		Spec: corev1.PodSpec{ServiceAccountName: sa.Name, NodeName: node,
			Containers: []corev1.Container{{Name: "agent", Image: testAgentSettings.Image}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("creating an agent pod on %s: %v", node, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pod) })
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if err := c.SubResource("token").Create(ctx, sa, req); err != nil {
		t.Fatalf("requesting the agent's token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(testCluster.cfg)
	cfg.BearerToken = req.Status.Token
	ac, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return ac
}

func transferNode(name string, pool *fxv1.TransferPool) *fxv1.TransferNode {
	return &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: fxv1.TransferNodeSpec{NodeName: name, PoolNamespace: pool.Namespace, PoolName: pool.Name}}
}

// TestAgentTokenWritesOnlyItsNode uses a real agent token (pod-bound, so it names the node) and checks that
// the agent may write its own node's TransferNode and heartbeat Lease and is refused, with a message saying
// why, for another node's, and that it reads no Secret: not its pool's (the kubelet mounts that), not another's.
func TestAgentTokenWritesOnlyItsNode(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "own-node", 2)
	pool := newPool(t, c, ns, "kv", "own-node")
	other := newPool(t, c, newNamespace(t, c), "kv", "own-node-other")
	agent := agentClient(t, c, pool, nodes[0])

	own := transferNode(nodes[0], pool)
	// RBAC reaches the authorizer a moment after the bindings exist.
	eventually(t, settle, "the agent creates its own node's TransferNode", func() error { return agent.Create(ctx, own) })
	t.Cleanup(func() { _ = c.Delete(context.Background(), own) })
	own.Status.AgentVersion = "test"
	if err := agent.Status().Update(ctx, own); err != nil {
		t.Fatalf("the agent may not write its own node's TransferNode status: %v", err)
	}

	// The policy reaches the API server's admission a moment after it was created with the suite.
	foreign := transferNode(nodes[1], pool)
	const want = "may write only the TransferNode of its own node"
	eventually(t, settle, "another node's TransferNode refused", func() error {
		err := agent.Create(ctx, foreign)
		if err == nil {
			_ = c.Delete(ctx, foreign)
			return fmt.Errorf("created")
		}
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("refused with %v, want %q", err, want)
		}
		return nil
	})
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), foreign) })
	foreign.Status.Endpoint = "10.0.0.66:7470" // the forged endpoint that once cut a restarted agent off
	if err := agent.Status().Update(ctx, foreign); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("writing another node's status: %v, want refused saying %q", err, want)
	}
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"status":{"endpoint":"10.0.0.66:7470"}}`))
	if err := agent.Status().Patch(ctx, foreign, patch); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("patching another node's status: %v, want refused saying %q", err, want)
	}

	lease := func(holder string) *coordinationv1.Lease {
		d := int32(30)
		now := metav1.NewMicroTime(time.Now())
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "hb-",
			Labels: map[string]string{fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: ns}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, RenewTime: &now}}
	}
	if err := agent.Create(ctx, lease(nodes[0])); err != nil {
		t.Errorf("the agent may not create its own heartbeat Lease: %v", err)
	}
	if err := agent.Create(ctx, lease(nodes[1])); err == nil || !strings.Contains(err.Error(), "may write only Leases held by its own node") {
		t.Errorf("a Lease held by another node: %v, want refused", err)
	}

	event := func(node string) *eventsv1.Event {
		return &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "ev"},
			EventTime: metav1.NewMicroTime(time.Now()), ReportingController: "fabricxfer-agent", ReportingInstance: "fabricxfer-agent-" + nodes[0],
			Action: "Detect", Reason: "EngineUnavailable", Type: corev1.EventTypeWarning, Note: "test",
			Regarding: corev1.ObjectReference{APIVersion: fxv1.GroupVersion.String(), Kind: "TransferNode", Name: node}}
	}
	if err := agent.Create(ctx, event(nodes[0])); err != nil {
		t.Errorf("the agent may not record an Event about its own TransferNode: %v", err)
	}
	if err := agent.Create(ctx, event(nodes[1])); err == nil || !strings.Contains(err.Error(), "may record Events only about the TransferNode of its own node") {
		t.Errorf("an Event about another node: %v, want refused", err)
	}

	// With DRA the agent publishes its node's ResourceSlice; RBAC grants ResourceSlices of every node and driver.
	inPool := func(node, driver, pool string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "own-node-slice-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
				Pool:    resourceapi.ResourcePool{Name: pool, Generation: 99, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "channel-0"}}}}
	}
	slice := func(node, driver string) *resourceapi.ResourceSlice { return inPool(node, driver, node) }
	const sliceWant = "may write only ResourceSlices of driver fabricxfer.io for its own node"
	mine := slice(nodes[0], "fabricxfer.io")
	if err := agent.Create(ctx, mine); err != nil {
		t.Errorf("the agent may not publish its own node's ResourceSlice: %v", err)
	} else {
		// As the agent's DRA driver clears its slices: a collection delete, admitted slice by slice.
		err := agent.DeleteAllOf(ctx, &resourceapi.ResourceSlice{}, client.MatchingFields{
			resourceapi.ResourceSliceSelectorDriver: "fabricxfer.io", resourceapi.ResourceSliceSelectorNodeName: nodes[0]})
		if err != nil {
			t.Errorf("the agent may not delete its own node's ResourceSlices: %v", err)
		} else if err := c.Get(ctx, client.ObjectKeyFromObject(mine), mine); !apierrors.IsNotFound(err) {
			t.Errorf("its own node's ResourceSlice after the agent deleted its slices: %v", err)
		}
	}
	// A slice of its own node in another node's pool, or a vPOD's, would lure that pool's claims to this node
	// (the scheduler takes the slice's node selector) and take that pool's device names.
	for _, s := range []*resourceapi.ResourceSlice{slice(nodes[1], "fabricxfer.io"), slice(nodes[0], "gpu.example.com"),
		inPool(nodes[0], "fabricxfer.io", nodes[1]), inPool(nodes[0], "fabricxfer.io", "vpod/rack-1")} {
		if err := agent.Create(ctx, s); err == nil || !strings.Contains(err.Error(), sliceWant) {
			_ = c.Delete(ctx, s)
			t.Errorf("a ResourceSlice of driver %s for node %s in pool %s: %v, want refused", s.Spec.Driver, *s.Spec.NodeName, s.Spec.Pool.Name, err)
		}
	}
	theirs := slice(nodes[1], "gpu.example.com")
	if err := c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), theirs) })
	if err := agent.Delete(ctx, theirs); err == nil || !strings.Contains(err.Error(), sliceWant) {
		t.Errorf("deleting another driver's ResourceSlice of another node: %v, want refused", err)
	}
	if err := agent.DeleteAllOf(ctx, &resourceapi.ResourceSlice{}); err == nil || !strings.Contains(err.Error(), sliceWant) {
		t.Errorf("deleting every ResourceSlice: %v, want refused", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(theirs), theirs); err != nil {
		t.Errorf("another driver's ResourceSlice after the agent's attempts: %v", err)
	}

	for _, key := range []client.ObjectKey{
		{Namespace: testAgentNamespace, Name: tlsSecretName(pool)},
		{Namespace: testAgentNamespace, Name: tlsSecretName(pool) + "-ca"},
		{Namespace: testAgentNamespace, Name: tlsSecretName(other)},
	} {
		if err := agent.Get(ctx, key, &corev1.Secret{}); !apierrors.IsForbidden(err) {
			t.Errorf("reading Secret %s with the agent's token: %v, want Forbidden", key, err)
		}
	}
	if err := agent.Get(ctx, client.ObjectKeyFromObject(other), &fxv1.TransferPool{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading another pool with the agent's token: %v, want Forbidden", err)
	}
	if err := agent.Get(ctx, client.ObjectKeyFromObject(pool), &fxv1.TransferPool{}); err != nil {
		t.Errorf("reading its own pool with the agent's token: %v", err)
	}
}
