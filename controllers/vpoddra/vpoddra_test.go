// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package vpoddra

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

func TestMembersLeaveOutMissingNodesAndFallBackToDeclared(t *testing.T) {
	v := v1alpha1.VPodTopology{
		Spec:   v1alpha1.VPodTopologySpec{Members: []v1alpha1.VPodMember{{Node: "declared"}}},
		Status: v1alpha1.VPodTopologyStatus{Members: []v1alpha1.VPodMember{{Node: "b"}, {Node: "a"}, {Node: "gone"}}, MissingMembers: []string{"gone"}},
	}
	if got := Members(v); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("discovered members %v, want [a b]", got)
	}
	v.Status = v1alpha1.VPodTopologyStatus{}
	if got := Members(v); !reflect.DeepEqual(got, []string{"declared"}) {
		t.Fatalf("declared members %v", got)
	}
}

func TestResourcesOnePoolPerVPodWithItsNodesAsSelector(t *testing.T) {
	doms := []v1alpha1.VPodTopology{
		{ObjectMeta: metav1.ObjectMeta{Name: "ualink-x"}, Spec: v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: "ualink:x/1"},
			Status: v1alpha1.VPodTopologyStatus{Members: []v1alpha1.VPodMember{{Node: "n2"}, {Node: "n1"}}, GPUs: 8}},
		{ObjectMeta: metav1.ObjectMeta{Name: "empty"}, Spec: v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: "ualink:y/1"}},
	}
	res := Resources(doms, 3)
	if len(res.Pools) != 1 {
		t.Fatalf("pools %v, want one (a vPOD without members gets none)", res.Pools)
	}
	p, ok := res.Pools["vpod/ualink-x"]
	if !ok {
		t.Fatalf("pool names %v", res.Pools)
	}
	terms := p.NodeSelector.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "kubernetes.io/hostname" ||
		!reflect.DeepEqual(terms[0].MatchExpressions[0].Values, []string{"n1", "n2"}) {
		t.Fatalf("node selector %+v: want one term, the hostname label in [n1 n2] (a slice takes one term)", terms)
	}
	devs := p.Slices[0].Devices
	if len(devs) != 3 || devs[2].Name != "vpod-2" || *devs[0].Attributes["vpod"].StringValue != "ualink:x/1" ||
		*devs[0].Attributes["type"].StringValue != "vpod" || *devs[0].Attributes["nodeCount"].IntValue != 2 {
		t.Fatalf("devices %+v", devs)
	}
}
