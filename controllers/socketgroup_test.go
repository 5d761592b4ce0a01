// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestSocketGroupReachesTheAgents runs the operator against a real API server: a pool's spec.socketGroup
// becomes the agent DaemonSet's --socket-gid, follows a change of the group (the field is mutable: the agents
// restart and regroup their directory) and goes away with it.
func TestSocketGroupReachesTheAgents(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "socketgroup")
	inAgents := client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(ns, "kv")}

	gidArgs := func() ([]string, error) {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, inAgents, ds); err != nil {
			return nil, err
		}
		var out []string
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--socket-gid") {
				out = append(out, a)
			}
		}
		return out, nil
	}
	expect := func(what string, want ...string) {
		t.Helper()
		eventually(t, settle, what, func() error {
			got, err := gidArgs()
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("agent args carry %v, want %v", got, want)
			}
			return nil
		})
	}
	setGroup := func(gid *int64) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p := &fxv1.TransferPool{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
				return err
			}
			p.Spec.SocketGroup = gid
			return c.Update(ctx, p)
		})
		if err != nil {
			t.Fatalf("setting socketGroup to %v: %v", gid, err)
		}
	}

	expect("a DaemonSet without --socket-gid for a pool without a group")
	gid := int64(4242)
	setGroup(&gid)
	expect("--socket-gid=4242 after the group is set", "--socket-gid=4242")
	other := int64(2147483647)
	setGroup(&other)
	expect("--socket-gid=2147483647 after the group changed", "--socket-gid=2147483647")
	setGroup(nil)
	expect("no --socket-gid after the group is removed")
}
