// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// access is one question to the API server's authorizer: may user do verb on resource (group/resource[/sub])
// named name in namespace?
type access struct {
	verb, group, resource, subresource, namespace, name string
	allowed                                             bool
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	return fmt.Sprintf("%s %s %q %s", a.verb, r, a.name, where)
}

// checkAccess asks the authorizer (SubjectAccessReview) each question for user and fails on every answer that
// differs from the expected one.
func checkAccess(t *testing.T, c client.Client, user string, groups []string, questions []access) {
	t.Helper()
	for _, q := range questions {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: q.verb, Group: q.group, Resource: q.resource,
				Subresource: q.subresource, Namespace: q.namespace, Name: q.name},
		}}
		if err := c.Create(context.Background(), review); err != nil {
			t.Fatalf("asking %s: %v", q, err)
		}
		if review.Status.Allowed != q.allowed {
			t.Errorf("%s may %s: %v, want %v (%s)", user, q, review.Status.Allowed, q.allowed, review.Status.Reason)
		}
	}
}

func serviceAccountGroups(namespace string) []string {
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
}

// TestOperatorAndAgentRBAC reads back what the operator (config/rbac) and a pool's agents (what the operator
// grants them) may do: no escalate, no ClusterRole writes, bind only on the agent ClusterRole, no Secret or
// DaemonSet outside the agents' namespace; agents read no Secret at all (the kubelet mounts theirs), only
// their own pool, and write Leases only in their pool's namespace.
func TestOperatorAndAgentRBAC(t *testing.T) {
	c := apiClient(t)
	ns, otherNS := newNamespace(t, c), newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "rbac-nobody")
	other := newPool(t, c, otherNS, "kv", "rbac-nobody-2")
	name := AgentObjectName(ns, pool.Name)
	eventually(t, settle, "the pool's RoleBinding", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &rbacv1.RoleBinding{})
	})

	const rbac = "rbac.authorization.k8s.io"
	checkAccess(t, c, operatorUser, serviceAccountGroups(testAgentNamespace), []access{
		{verb: "escalate", group: rbac, resource: "clusterroles", name: "cluster-admin"},
		{verb: "escalate", group: rbac, resource: "roles", namespace: ns},
		{verb: "bind", group: rbac, resource: "clusterroles", name: "cluster-admin"},
		{verb: "bind", group: rbac, resource: "clusterroles", name: "admin"},
		{verb: "bind", group: rbac, resource: "clusterroles", name: AgentClusterRole, allowed: true},
		{verb: "create", group: rbac, resource: "clusterroles"},
		{verb: "delete", group: rbac, resource: "clusterroles", name: AgentClusterRole},
		{verb: "get", resource: "secrets", namespace: ns},
		{verb: "list", resource: "secrets"},
		{verb: "get", resource: "secrets", namespace: "kube-system"},
		{verb: "get", resource: "secrets", namespace: testAgentNamespace, allowed: true},
		{verb: "create", group: "apps", resource: "daemonsets", namespace: ns},
		{verb: "list", group: "apps", resource: "daemonsets"},
		{verb: "create", group: "apps", resource: "daemonsets", namespace: testAgentNamespace, allowed: true},
		{verb: "create", resource: "pods", namespace: testAgentNamespace},
		{verb: "create", resource: "serviceaccounts", namespace: ns},
		{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: testAgentNamespace},
		{verb: "list", resource: "pods"},
		{verb: "create", group: rbac, resource: "rolebindings", namespace: ns, allowed: true},
		{verb: "create", group: rbac, resource: "clusterrolebindings", allowed: true},
		// The signer of agents' node certificates, and no other signer.
		{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "fabricxfer.io/agent", allowed: true},
		{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "fabricxfer.io/agent", allowed: true},
		{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kube-apiserver-client"},
		{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kubelet-serving"},
		{verb: "create", group: "certificates.k8s.io", resource: "certificatesigningrequests"},
	})

	agent := "system:serviceaccount:" + testAgentNamespace + ":" + name
	checkAccess(t, c, agent, serviceAccountGroups(testAgentNamespace), []access{
		{verb: "get", group: fxv1.GroupVersion.Group, resource: "transferpools", namespace: ns, name: pool.Name, allowed: true},
		{verb: "get", group: fxv1.GroupVersion.Group, resource: "transferpools", namespace: ns, name: "someone-else"},
		{verb: "get", group: fxv1.GroupVersion.Group, resource: "transferpools", namespace: otherNS, name: other.Name},
		{verb: "update", group: fxv1.GroupVersion.Group, resource: "transferpools", namespace: ns, name: pool.Name},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: ns, allowed: true},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: otherNS},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"},
		{verb: "get", resource: "secrets", namespace: testAgentNamespace, name: name + "-tls"},
		{verb: "get", resource: "secrets", namespace: testAgentNamespace, name: AgentObjectName(otherNS, other.Name) + "-tls"},
		{verb: "get", resource: "secrets", namespace: testAgentNamespace, name: name + "-tls-ca"},
		{verb: "get", resource: "secrets", namespace: ns},
		{verb: "list", resource: "secrets"},
		{verb: "create", resource: "pods", namespace: testAgentNamespace},
		{verb: "patch", group: fxv1.GroupVersion.Group, resource: "transfernodes", subresource: "status", name: "n1", allowed: true},
		// The reporter watches its own TransferNode (by field selector) to write back a status changed by others.
		{verb: "watch", group: fxv1.GroupVersion.Group, resource: "transfernodes", allowed: true},
		{verb: "delete", group: fxv1.GroupVersion.Group, resource: "transfernodes", name: "n1"},
		{verb: "update", group: "apps", resource: "daemonsets", namespace: testAgentNamespace, name: name},
		// Its own certificate is asked for and read back; nobody's request is approved or signed by an agent.
		{verb: "create", group: "certificates.k8s.io", resource: "certificatesigningrequests", allowed: true},
		{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "approval"},
		{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "status"},
		{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "fabricxfer.io/agent"},
		{verb: "delete", group: "certificates.k8s.io", resource: "certificatesigningrequests"},
	})

	// The rules as `kubectl auth can-i --list` shows them, for the record (go test -v).
	for _, who := range []struct{ user, namespace string }{{operatorUser, ns}, {agent, ns}} {
		t.Logf("%s in %s:\n%s", who.user, who.namespace, rulesOf(t, who.user, who.namespace))
	}
}

// rulesOf lists what user may do in namespace (SelfSubjectRulesReview as that user).
func rulesOf(t *testing.T, user, namespace string) string {
	t.Helper()
	cfg := rest.CopyConfig(testCluster.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: serviceAccountGroups(strings.Split(user, ":")[2])}
	c, err := client.New(cfg, client.Options{Scheme: testCluster.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	review := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}
	if err := c.Create(context.Background(), review); err != nil {
		t.Fatalf("reviewing the rules of %s: %v", user, err)
	}
	var b strings.Builder
	for _, r := range review.Status.ResourceRules {
		fmt.Fprintf(&b, "  %-60s %-40v %v\n", strings.Join(r.Resources, ",")+"."+strings.Join(r.APIGroups, ","), r.ResourceNames, r.Verbs)
	}
	return b.String()
}
