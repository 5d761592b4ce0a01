// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
)

// agentUser is the user name of the pool's agent ServiceAccount, the identity the operator binds the agents'
// Role and ClusterRole to (controllers.DesiredServiceAccount).
func agentUser(o options) string {
	return "system:serviceaccount:" + o.agentNamespace + ":" + controllers.AgentObjectName(o.poolNamespace, o.poolName)
}

// agentChecks are what one agent's report round does (agent/nodesync): read its Node, apply its TransferNode
// and its status, create and renew its heartbeat Lease in the pool's namespace.
func agentChecks(o options) []authorizationv1.ResourceAttributes {
	return []authorizationv1.ResourceAttributes{
		{Verb: "get", Resource: "nodes", Name: nodeName(0)},
		{Verb: "patch", Group: v1alpha1.GroupVersion.Group, Resource: "transfernodes", Name: nodeName(0)},
		{Verb: "patch", Group: v1alpha1.GroupVersion.Group, Resource: "transfernodes", Subresource: "status", Name: nodeName(0)},
		{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: o.poolNamespace},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: o.poolNamespace, Name: "any"},
	}
}

// waitAgentsAllowed waits, as a node waits before it runs a DaemonSet's pod, until the operator has applied
// the pool's agent DaemonSet, and, when the agents have their own identity, until the API server grants them
// every request of a report round: the operator applies the ServiceAccount and its bindings before the
// DaemonSet, and real agents start only then, so a round refused for want of a binding not yet made would be
// the harness's artefact. It returns the agents' identity as the API server sees it.
func waitAgentsAllowed(ctx context.Context, o options, admin client.Client, agentAuth *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(agentAuth)
	if err != nil {
		return "", fmt.Errorf("creating the agents' REST client: %w", err)
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the API server who the agents are: %w", err)
	}
	u := review.Status.UserInfo
	who := fmt.Sprintf("%s (groups %s)", u.Username, strings.Join(u.Groups, ","))
	own := u.Username == agentUser(o)
	if !own && u.Username != "admin" {
		return "", fmt.Errorf("the agents authenticate as %s, neither %s nor admin", who, agentUser(o))
	}

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ds := &appsv1.DaemonSet{}
	key := client.ObjectKey{Namespace: o.agentNamespace, Name: controllers.AgentObjectName(o.poolNamespace, o.poolName)}
	var missing string
	for {
		missing = ""
		switch err := admin.Get(ctx, key, ds); {
		case apierrors.IsNotFound(err):
			missing = "the DaemonSet " + key.String()
		case err != nil && ctx.Err() == nil:
			return "", fmt.Errorf("reading the agents' DaemonSet %s: %w", key, err)
		}
		for _, attrs := range agentChecks(o) {
			if missing != "" || !own {
				break
			}
			sar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
			got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				if ctx.Err() != nil {
					missing = "an answer on their rights"
					break
				}
				return "", fmt.Errorf("asking whether the agents may %s %s: %w", attrs.Verb, attrs.Resource, err)
			}
			if !got.Status.Allowed {
				missing = fmt.Sprintf("the right to %s %s %s", attrs.Verb, attrs.Resource, attrs.Subresource)
			}
		}
		if missing == "" {
			return who, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return "", fmt.Errorf("the agents (%s) still lack %s a minute after the pool was created", who, missing)
			}
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
