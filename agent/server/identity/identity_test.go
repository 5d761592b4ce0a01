// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPodUIDFromCgroup(t *testing.T) {
	for name, tc := range map[string]struct{ content, want string }{
		"systemd driver, cgroup v2": {"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_aaaa_bbbb_cccc_0123456789ab.slice/cri-containerd-deadbeef.scope\n",
			"1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"},
		"cgroupfs driver, cgroup v1": {"12:memory:/kubepods/besteffort/pod1b2c3d4e-aaaa-bbbb-cccc-0123456789ab/5f1e\n11:cpu:/\n",
			"1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"},
		"guaranteed QoS (no class level)": {"0::/kubepods.slice/kubepods-pod99999999_1111_2222_3333_444444444444.slice/crio-1.scope",
			"99999999-1111-2222-3333-444444444444"},
		"not a pod":     {"0::/user.slice/user-1000.slice/session-2.scope\n", ""},
		"empty":         {"", ""},
		"short pod id":  {"0::/kubepods/pod1234/x\n", ""},
		"garbage lines": {"nonsense\n::\n", ""},
	} {
		if got := PodUIDFromCgroup(tc.content); got != tc.want {
			t.Errorf("%s: got %q, want %q", name, got, tc.want)
		}
	}
}

func TestNamespaceAllowed(t *testing.T) {
	for _, tc := range []struct {
		allowed []string
		ns      string
		want    bool
	}{
		{nil, "infer", true},
		{nil, "other", false},
		{[]string{"a", "b"}, "b", true},
		{[]string{"a", "b"}, "infer", false}, // an explicit list replaces the default
		{[]string{"*"}, "anything", true},
	} {
		if got := NamespaceAllowed("infer", tc.allowed, tc.ns); got != tc.want {
			t.Errorf("NamespaceAllowed(infer, %v, %s) = %v, want %v", tc.allowed, tc.ns, got, tc.want)
		}
	}
}

type podLookup func(uid string) (PodRef, error)

func (f podLookup) PodByUID(_ context.Context, uid string) (PodRef, error) { return f(uid) }

func TestIdentifyReadsTheProcRoot(t *testing.T) {
	root := t.TempDir()
	write := func(pid, content string) {
		os.MkdirAll(filepath.Join(root, pid), 0o755)
		os.WriteFile(filepath.Join(root, pid, "cgroup"), []byte(content), 0o644)
	}
	write("10", "0::/user.slice\n")
	write("11", "0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/x.scope\n")
	pods := podLookup(func(uid string) (PodRef, error) {
		if uid == "11111111-2222-3333-4444-555555555555" {
			return PodRef{Namespace: "infer", Name: "vllm-0"}, nil
		}
		return PodRef{}, ErrPodNotFound
	})
	ctx := context.Background()

	strict := Identifier{ProcRoot: root, Pods: pods}
	if _, err := strict.Identify(ctx, PeerCred{PID: 10}); err == nil || !strings.Contains(err.Error(), "--allow-local") {
		t.Errorf("local process without allow-local: %v, want a refusal naming --allow-local", err)
	}
	c, err := strict.Identify(ctx, PeerCred{PID: 11, UID: 1000})
	if err != nil || c.Namespace != "infer" || c.PodName != "vllm-0" || c.Key != "pod/11111111-2222-3333-4444-555555555555" {
		t.Errorf("pod process: %+v, %v", c, err)
	}
	if _, err := strict.Identify(ctx, PeerCred{PID: 12}); err == nil || !strings.Contains(err.Error(), "cgroup of pid 12") {
		t.Errorf("vanished process: %v", err)
	}
	write("13", "0::/kubepods.slice/kubepods-pod99999999_2222_3333_4444_555555555555.slice/x.scope\n")
	if _, err := strict.Identify(ctx, PeerCred{PID: 13}); !errors.Is(err, ErrPodNotFound) {
		t.Errorf("pod unknown to the API server: %v, want ErrPodNotFound", err)
	}
	local := Identifier{ProcRoot: root, AllowLocal: true}
	c, err = local.Identify(ctx, PeerCred{PID: 10, UID: 1000})
	if err != nil || !c.Local || c.Key != "local/uid=1000" {
		t.Errorf("local process with allow-local: %+v, %v", c, err)
	}
}
