// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const (
	layoutUID   = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"
	layoutUIDus = "1b2c3d4e_aaaa_bbbb_cccc_0123456789ab"
	otherUID    = "99999999-1111-2222-3333-444444444444"
	dockerID    = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// Only the kubelet's layouts, at their place, identify a pod; a pod UID anywhere else is refused.
func TestPodUIDOnlyFromKubeletLayouts(t *testing.T) {
	accepted := map[string]string{
		"systemd burstable":  "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + layoutUIDus + ".slice/cri-containerd-1.scope\n",
		"systemd besteffort": "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + layoutUIDus + ".slice/crio-1.scope\n",
		"systemd guaranteed": "0::/kubepods.slice/kubepods-pod" + layoutUIDus + ".slice/cri-containerd-1.scope\n",
		"systemd, kubelet root (kind)": "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
			"kubelet-kubepods-besteffort-pod" + layoutUIDus + ".slice/cri-containerd-1.scope\n",
		"systemd, node in docker":      "0::/system.slice/docker-" + dockerID + ".scope/kubepods.slice/kubepods-pod" + layoutUIDus + ".slice/x.scope\n",
		"cgroupfs burstable, v1":       "12:memory:/kubepods/burstable/pod" + layoutUID + "/5f1e\n11:cpu:/kubepods/burstable/pod" + layoutUID + "/5f1e\n1:name=systemd:/\n",
		"cgroupfs guaranteed":          "0::/kubepods/pod" + layoutUID + "/5f1e\n",
		"cgroupfs, kubelet root":       "0::/kubelet/kubepods/besteffort/pod" + layoutUID + "/5f1e\n",
		"cgroupfs, node in docker":     "4:memory:/docker/" + dockerID + "/kubepods/burstable/pod" + layoutUID + "/c\n",
		"private namespace, systemd":   "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod" + layoutUIDus + ".slice/cri-containerd-1.scope\n",
		"private namespace, same QoS":  "0::/../../kubepods-burstable-pod" + layoutUIDus + ".slice/cri-containerd-1.scope\n",
		"private namespace, cgroupfs":  "0::/../../../besteffort/pod" + layoutUID + "/c\n",
		"nested fake under a real pod": "0::/kubepods/burstable/pod" + layoutUID + "/c/kubepods/burstable/pod" + otherUID + "/x\n",
	}
	for name, content := range accepted {
		if uid, err := podUIDFromCgroup(content); err != nil || uid != layoutUID {
			t.Errorf("%s: %q, %v; want %s", name, uid, err, layoutUID)
		}
	}
	refused := map[string]string{
		"delegated cgroupfs subtree": "0::/rt-user-65534/pod" + layoutUID + "\n",
		"user's systemd manager": "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-besteffort.slice/" +
			"kubepods-besteffort-pod" + layoutUIDus + ".slice/x.scope\n",
		"slice not under its parent":    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod" + layoutUIDus + ".slice/x.scope\n",
		"pod slice at the root":         "0::/kubepods-burstable-pod" + layoutUIDus + ".slice/x.scope\n",
		"unknown QoS":                   "0::/kubepods/gold/pod" + layoutUID + "/c\n",
		"extra level":                   "0::/kubepods/burstable/tenant/pod" + layoutUID + "/c\n",
		"other root":                    "0::/mine/kubepods/pod" + layoutUID + "/c\n",
		"other systemd root":            "0::/rt.slice/rt-kubepods.slice/rt-kubepods-pod" + layoutUIDus + ".slice/c\n",
		"dot-dot in the middle":         "0::/x/../kubepods/pod" + layoutUID + "/c\n",
		"relative, not the hierarchy":   "0::/../../user.slice/kubepods/pod" + layoutUID + "/c\n",
		"uid inside another name":       "0::/kubepods/burstable/mypod" + layoutUID + "/c\n",
		"two pods on two lines":         "2:cpu:/kubepods/pod" + layoutUID + "/c\n1:memory:/kubepods/pod" + otherUID + "/c\n",
		"forged line beside a real one": "2:cpu:/kubepods/pod" + layoutUID + "/c\n1:name=x:/rt/pod" + layoutUID + "\n",
	}
	for name, content := range refused {
		if uid, err := podUIDFromCgroup(content); err == nil {
			t.Errorf("%s: accepted as pod %q", name, uid)
		}
	}
	for name, content := range map[string]string{
		"user session": "0::/user.slice/user-1000.slice/session-2.scope\n", "root": "0::/\n",
		"private namespace, host process": "0::/../../../../system.slice/sshd.service\n",
	} {
		if uid, err := podUIDFromCgroup(content); err != nil || uid != "" {
			t.Errorf("%s: %q, %v; want no pod", name, uid, err)
		}
	}
}

// A process in a forged pod cgroup is refused even where local callers are admitted, and the API server
// still decides whether a kubelet-placed pod runs on this node.
func TestIdentifyRefusesForgedCgroupsFromTheProcTree(t *testing.T) {
	root := t.TempDir()
	write := func(pid int, content string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(20, "0::/rt-user-65534/pod"+layoutUID+"\n")
	write(21, "0::/kubepods.slice/kubepods-pod"+layoutUIDus+".slice/cri-containerd-1.scope\n")
	write(22, "0::/kubepods/pod"+otherUID+"/c\n")
	pods := podLookup(func(uid string) (PodRef, error) {
		if uid == layoutUID {
			return PodRef{Namespace: "infer", Name: "vllm-0"}, nil
		}
		return PodRef{}, ErrPodNotFound // not on this node
	})
	id := Identifier{ProcRoot: root, Pods: pods, AllowLocal: true}
	ctx := context.Background()
	if c, err := id.Identify(ctx, PeerCred{PID: 20, UID: 65534}); err == nil || !strings.Contains(err.Error(), "kubelet") {
		t.Fatalf("forged cgroup: %+v, %v; want a refusal", c, err)
	}
	if c, err := id.Identify(ctx, PeerCred{PID: 21}); err != nil || c.Key != "pod/"+layoutUID {
		t.Fatalf("kubelet pod: %+v, %v", c, err)
	}
	if _, err := id.Identify(ctx, PeerCred{PID: 22}); err == nil {
		t.Fatal("a pod the API server does not place on this node was admitted")
	}
}
