// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fabricxfer/fabricxfer/agent/dra"
)

// startScheduler runs the real kube-scheduler (bin/kube-scheduler, make tools) against the test's API server.
func startScheduler(t *testing.T, env *envtest.Environment) {
	t.Helper()
	bin := filepath.Join(repoRoot, "bin", "kube-scheduler")
	if v := os.Getenv("KUBEBUILDER_ASSETS"); v != "" {
		bin = filepath.Join(v, "kube-scheduler")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("kube-scheduler not built: run make tools")
	}
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "scheduler", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "scheduler.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--leader-elect=false", "--secure-port=0", "-v=2")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kube-scheduler: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("kube-scheduler log (end):\n%s", b)
		}
	})
}

// readyNode creates a schedulable Node that reports Ready, as a kubelet would.
func readyNode(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	createNode(t, cs, name)
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"), corev1.ResourcePods: resource.MustParse("110")}
	n.Status.Capacity, n.Status.Allocatable = capacity, capacity
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server taints new Nodes not-ready; the node lifecycle controller lifts that once they report
	// Ready. It does not run here, so the test does what it would.
	n, err = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// vpodClaim is a claim for one fabricxfer.io device whose node's GPUs are in the given vPOD.
func vpodClaim(t *testing.T, cs kubernetes.Interface, name, vpod string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := cs.ResourceV1().ResourceClaims("default").Create(context.Background(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "socket", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: dra.DriverName,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes["fabricxfer.io"].pool == "kv" && device.attributes["fabricxfer.io"].vpod == %q`, vpod),
				}}},
			},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func claimPod(t *testing.T, cs kubernetes.Interface, name, claim string) {
	t.Helper()
	_, err := cs.CoreV1().Pods("default").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "fabricxfer", ResourceClaimName: ptr.To(claim)}},
			Containers: []corev1.Container{{Name: "vllm", Image: "registry.example/vllm:test", Resources: corev1.ResourceRequirements{
				Claims: []corev1.ResourceClaim{{Name: "fabricxfer"}},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// Two vPODs of one UALink pod, as the scheduler tests place claims in them.
const testVPodA, testVPodB = "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1", "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/2"

// createDeviceClass installs the fabricxfer.io DeviceClass the chart ships, which claims name.
func createDeviceClass(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: dra.DriverName},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "fabricxfer.io"`}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSchedulerPlacesClaimsInsideTheirVPod: with the real kube-scheduler and Nodes that report Ready, pods
// whose claims' CEL selector names a vPOD are bound only to nodes of that vPOD (Kubernetes' own DRA allocator
// reads the agents' ResourceSlices), and the agent of the chosen node prepares the claim while another node's
// agent refuses it.
func TestSchedulerPlacesClaimsInsideTheirVPod(t *testing.T) {
	env, cs := startEnv(t)
	startScheduler(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createDeviceClass(ctx, t, cs)
	const vpodA, vpodB = testVPodA, testVPodB
	domains := map[string]string{"node-a1": vpodA, "node-a2": vpodA, "node-b1": vpodB, "node-c": ""}
	drivers := map[string]*running{}
	for node, dom := range domains {
		readyNode(t, cs, node)
		drivers[node] = startDriverWith(t, cs, node, &detector{rep: report(4, dom)}, 2, "/var/run/fabricxfer/kv-"+node)
	}
	eventually(t, "four slices", func() error {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 4 {
			return fmt.Errorf("%d slices, %v", len(l.Items), err)
		}
		return nil
	})

	// Two devices per node: four pods fit in vPOD A (two nodes), one in vPOD B.
	want := map[string]string{"prefill-0": vpodA, "decode-0": vpodA, "prefill-1": vpodA, "decode-1": vpodA, "other": vpodB}
	for pod, vpod := range want {
		vpodClaim(t, cs, pod, vpod)
		claimPod(t, cs, pod, pod)
	}
	placed := map[string]string{}
	eventually(t, "every pod bound", func() error {
		for pod := range want {
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
	perNode := map[string]int{}
	for pod, node := range placed {
		if domains[node] != want[pod] {
			t.Fatalf("pod %s (claim for %s) bound to %s, which is in %q; all placements %v", pod, want[pod], node, domains[node], placed)
		}
		perNode[node]++
	}
	if perNode["node-a1"] != 2 || perNode["node-a2"] != 2 {
		t.Fatalf("vPOD A's four pods are not two per node (two channels each): %v", placed)
	}

	for pod, node := range placed {
		c, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 || c.Status.Allocation.Devices.Results[0].Pool != node {
			t.Fatalf("claim %s allocation %+v, want a device of %s", pod, c.Status.Allocation, node)
		}
		resp, err := dialPlugin(t, drivers[node].drv.PluginSocket()).prepare(ctx, c)
		if err != nil || resp.Claims[string(c.UID)].GetError() != "" {
			t.Fatalf("node %s preparing claim %s: %v %+v", node, pod, err, resp)
		}
		spec, err := os.ReadFile(filepath.Join(drivers[node].dir, "cdi", "fabricxfer.io-"+string(c.UID)+".json"))
		if err != nil {
			t.Fatalf("node %s wrote no CDI spec for %s: %v", node, pod, err)
		}
		if !containsAll(string(spec), "/var/run/fabricxfer/kv-"+node, "FABRICXFER_SOCKET=/run/fabricxfer/agent.sock") {
			t.Fatalf("CDI spec of %s on %s:\n%s", pod, node, spec)
		}
		resp, err = dialPlugin(t, drivers["node-c"].drv.PluginSocket()).prepare(ctx, c)
		if err != nil || resp.Claims[string(c.UID)].GetError() == "" {
			t.Fatalf("node-c prepared claim %s of %s: %v %+v", pod, node, err, resp)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
