// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/ptr"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers/vpoddra"
)

func selectorClaim(t *testing.T, cs kubernetes.Interface, name, request, expr string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := cs.ResourceV1().ResourceClaims("default").Create(context.Background(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: request, Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: dra.DriverName,
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
			},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSharedVPodClaimKeepsItsPodsInsideTheVPod: the operator's vPOD devices (controllers/vpoddra) carry the
// vPOD's nodes as their node selector, so pods that share one claim on such a device are bound only inside the
// vPOD by the real scheduler, though their own channel claims would fit any node; each node's agent prepares
// the shared claim with no container edits and the pod's channel claim with the socket, and an agent outside
// the vPOD refuses the shared claim.
func TestSharedVPodClaimKeepsItsPodsInsideTheVPod(t *testing.T) {
	env, cs := startEnv(t)
	startScheduler(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createDeviceClass(ctx, t, cs)
	const vpodA, vpodB = testVPodA, testVPodB
	domains := map[string]string{"node-a1": vpodA, "node-a2": vpodA, "node-b1": vpodB, "node-b2": vpodB, "node-c": ""}
	drivers := map[string]*running{}
	for node, dom := range domains {
		readyNode(t, cs, node)
		drivers[node] = startDriverWith(t, cs, node, &detector{rep: report(4, dom)}, 2, "/var/run/fabricxfer/kv-"+node)
	}
	logger := testr.New(t)
	pub := &vpoddra.Publisher{Kube: cs, Metadata: metadata.NewForConfigOrDie(env.Config), Devices: 2, Log: &logger}
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Start(pubCtx) }()
	defer func() { stopPub(); <-pubDone }()
	member := func(n string) v1alpha1.VPodMember { return v1alpha1.VPodMember{Node: n, GPUs: []int32{0, 1, 2, 3}} }
	pub.Update([]v1alpha1.VPodTopology{
		{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DomainObjectName(vpodA)}, Spec: v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: vpodA},
			Status: v1alpha1.VPodTopologyStatus{Members: []v1alpha1.VPodMember{member("node-a1"), member("node-a2")}, Nodes: 2, GPUs: 8}},
		{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DomainObjectName(vpodB)}, Spec: v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: vpodB},
			Status: v1alpha1.VPodTopologyStatus{Members: []v1alpha1.VPodMember{member("node-b1"), member("node-b2")}, Nodes: 2, GPUs: 8}},
	})
	eventually(t, "five node slices and two vPOD slices", func() error {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		vpods := 0
		for _, s := range l.Items {
			if s.Spec.NodeSelector != nil {
				vpods++
				if len(s.Spec.NodeSelector.NodeSelectorTerms) != 1 {
					return fmt.Errorf("vPOD slice %s node selector %+v", s.Name, s.Spec.NodeSelector)
				}
			}
		}
		if len(l.Items) != 7 || vpods != 2 {
			return fmt.Errorf("%d slices, %d of vPODs", len(l.Items), vpods)
		}
		return nil
	})

	selectorClaim(t, cs, "group-a", "vpod", fmt.Sprintf(`device.attributes["fabricxfer.io"].type == "vpod" && device.attributes["fabricxfer.io"].vpod == %q`, vpodA))
	pods := []string{"prefill-0", "decode-0", "prefill-1", "decode-1"}
	for _, pod := range pods {
		// No type test: the vPOD devices must not match (nor break) a selector written for channels.
		selectorClaim(t, cs, pod+"-socket", "socket", `device.attributes["fabricxfer.io"].pool == "kv"`)
		_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "default"},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{
					{Name: "group", ResourceClaimName: ptr.To("group-a")},
					{Name: "socket", ResourceClaimName: ptr.To(pod + "-socket")},
				},
				Containers: []corev1.Container{{Name: "vllm", Image: "registry.example/vllm:test", Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: "group"}, {Name: "socket"}},
				}}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	placed := map[string]string{}
	eventually(t, "every pod bound", func() error {
		for _, pod := range pods {
			p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.NodeName == "" {
				return fmt.Errorf("pod %s not bound yet", pod)
			}
			placed[pod] = p.Spec.NodeName
		}
		return nil
	})
	for pod, node := range placed {
		if domains[node] != vpodA {
			t.Fatalf("pod %s of the shared vPOD A claim bound to %s (in %q); placements %v", pod, node, domains[node], placed)
		}
	}
	group, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, "group-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(group.Status.ReservedFor) != len(pods) || group.Status.Allocation == nil ||
		group.Status.Allocation.Devices.Results[0].Pool != vpoddra.PoolName(v1alpha1.DomainObjectName(vpodA)) {
		t.Fatalf("shared claim status %+v", group.Status)
	}
	for pod, node := range placed {
		socket, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, pod+"-socket", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := dialPlugin(t, drivers[node].drv.PluginSocket()).prepare(ctx, group, socket)
		if err != nil {
			t.Fatalf("node %s preparing %s's claims: %v", node, pod, err)
		}
		g, s := resp.Claims[string(group.UID)], resp.Claims[string(socket.UID)]
		if g.GetError() != "" || len(g.GetDevices()) != 1 || len(g.Devices[0].CdiDeviceIds) != 0 {
			t.Fatalf("node %s: the shared vPOD claim prepared as %+v", node, g)
		}
		if s.GetError() != "" || len(s.GetDevices()) != 1 || len(s.Devices[0].CdiDeviceIds) != 1 {
			t.Fatalf("node %s: %s's channel claim prepared as %+v", node, pod, s)
		}
	}
	resp, err := dialPlugin(t, drivers["node-b1"].drv.PluginSocket()).prepare(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Claims[string(group.UID)].GetError(); e == "" {
		t.Fatal("an agent outside vPOD A prepared its shared claim")
	}

	pub.Update(nil)
	eventually(t, "vPOD slices gone with their VPodTopologies", func() error {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 5 {
			return fmt.Errorf("%d slices, %v", len(l.Items), err)
		}
		return nil
	})
}
