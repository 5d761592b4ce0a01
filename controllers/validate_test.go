// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestNoFlagFromANonsenseQuantity feeds the quantities that once became flags such as
// --pool-gpu-bytes=-9223372036854775808 to the DaemonSet builder: each must be refused, never written.
func TestNoFlagFromANonsenseQuantity(t *testing.T) {
	cases := []struct {
		name string
		mem  fxv1.PoolMemory
		want string
	}{
		{"perGPU 2^63", fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("9223372036854775808"))}, "spec.memory.perGPU"},
		{"perGPU 8Ei", fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("8Ei"))}, "spec.memory.perGPU"},
		{"perGPU 1e100", fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("1e100"))}, "spec.memory.perGPU"},
		{"perGPU negative", fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("-1Gi"))}, "spec.memory.perGPU"},
		{"perGPU a fraction of a byte", fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("2097152500m"))}, "whole number of bytes"},
		{"hostStaging 100Pi", fxv1.PoolMemory{HostStaging: ptr(resource.MustParse("100Pi"))}, "spec.memory.hostStaging"},
		{"maxRegisteredPerCaller 0", fxv1.PoolMemory{MaxRegisteredPerCaller: ptr(resource.MustParse("0"))}, "spec.memory.maxRegisteredPerCaller"},
		{"maxRegisteredPerCaller -1Gi", fxv1.PoolMemory{MaxRegisteredPerCaller: ptr(resource.MustParse("-1Gi"))}, "spec.memory.maxRegisteredPerCaller"},
		{"maxRegisteredPerCaller 1m", fxv1.PoolMemory{MaxRegisteredPerCaller: ptr(resource.MustParse("1m"))}, "spec.memory.maxRegisteredPerCaller"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: fxv1.TransferPoolSpec{Memory: tc.mem}}
			ds, err := DesiredDaemonSet(pool, AgentSettings{Image: "registry.local/agent:dev"})
			if err == nil {
				t.Fatalf("built a DaemonSet with args %v", ds.Spec.Template.Spec.Containers[0].Args)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refused with %q, want it to name %q", err, tc.want)
			}
		})
	}

	// Quantities written in decimal form are whole numbers of bytes too, and become exact flags.
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: fxv1.TransferPoolSpec{Memory: fxv1.PoolMemory{
		PerGPU: ptr(resource.MustParse("1.5Gi")), HostStaging: ptr(resource.MustParse("1Ti")), MaxRegisteredPerCaller: ptr(resource.MustParse("16Ti"))}}}
	ds := mustDaemonSet(t, pool, AgentSettings{Image: "registry.local/agent:dev"})
	args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--pool-gpu-bytes=1610612736", "--pool-host-bytes=1099511627776", "--max-registered-bytes=17592186044416"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %s lack %s", args, want)
		}
	}
	if got := ds.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().Value(); got != 512<<20+1<<40 {
		t.Errorf("memory limit %d, want 512Mi plus the 1Ti of host staging", got)
	}
}

func TestSocketDirMustLieUnderThePrefix(t *testing.T) {
	for _, tc := range []struct {
		dir, prefix string
		ok          bool
	}{
		{"/var/run/fabricxfer", "/var/run/fabricxfer", true},
		{"/var/run/fabricxfer/team-a", "/var/run/fabricxfer", true},
		{"/etc", "/var/run/fabricxfer", false},
		{"//", "/var/run/fabricxfer", false},
		{"/.", "/var/run/fabricxfer", false},
		{"/root/.ssh", "/var/run/fabricxfer", false},
		{"/proc/sys/kernel", "/var/run/fabricxfer", false},
		{"/var/run/fabricxfer/..", "/var/run/fabricxfer", false},
		{"/var/run/fabricxfer/a/../../x", "/var/run/fabricxfer", false},
		{"/var/run/fabricxfer/", "/var/run/fabricxfer", false},
		{"/var/run/fabricxfer2", "/var/run/fabricxfer", false},
		{"/run/fx.d/a", "/run/fx.d", true},
		{"/run/fxXd/a", "/run/fx.d", false}, // the prefix is literal, not a pattern
	} {
		if got := socketDirUnder(tc.dir, tc.prefix); got != tc.ok {
			t.Errorf("socketDirUnder(%q, %q) = %v, want %v", tc.dir, tc.prefix, got, tc.ok)
		}
	}
	for _, bad := range []string{"/", "", "relative", "/var/run/", "/var/../etc", "//var"} {
		if ValidateSocketDirPrefix(bad) == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
	if err := ValidateSocketDirPrefix("/var/run/fabricxfer"); err != nil {
		t.Errorf("the default prefix refused: %v", err)
	}
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: fxv1.TransferPoolSpec{SocketDir: "/var/run/fabricxfer/a"}}
	if err := ValidatePool(pool, AgentSettings{SocketDirPrefix: "/run/other"}); err == nil || !strings.Contains(err.Error(), "/run/other") {
		t.Errorf("a socketDir outside the admin's prefix: got %v, want it refused naming the prefix", err)
	}
}

func TestAgentImageMustBeTheOperatorsOrAllowed(t *testing.T) {
	settings := AgentSettings{Image: "ghcr.io/fabricxfer/agent:v1", ImageAllowlist: []string{"registry.corp/fx/agent:v2", "registry.corp/fx/agent-dev:*"}}
	for _, tc := range []struct {
		image string
		ok    bool
	}{
		{"", true},
		{"ghcr.io/fabricxfer/agent:v1", true},
		{"registry.corp/fx/agent:v2", true},
		{"registry.corp/fx/agent-dev:abc123", true},
		{"registry.corp/fx/agent:v3", false},
		{"attacker.example/agent:v1", false},
		{"ghcr.io/fabricxfer/agent:v1-evil", false},
	} {
		pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: fxv1.TransferPoolSpec{Agent: fxv1.AgentSpec{Image: tc.image}}}
		err := ValidatePool(pool, settings)
		if (err == nil) != tc.ok {
			t.Errorf("image %q: got %v, want allowed=%v", tc.image, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrImageNotAllowed) {
			t.Errorf("image %q refused as %v, want ErrImageNotAllowed", tc.image, err)
		}
	}
}

func TestValidatePoolRefusesWhatMakesInvalidObjects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*fxv1.TransferPool)
		want string
	}{
		{"pool name too long", func(p *fxv1.TransferPool) { p.Name = strings.Repeat("p", 64) }, "pool name"},
		{"node selector value", func(p *fxv1.TransferPool) { p.Spec.NodeSelector = map[string]string{"gpu": "-x-"} }, "spec.nodeSelector"},
		{"node selector key", func(p *fxv1.TransferPool) { p.Spec.NodeSelector = map[string]string{"a b": "x"} }, "spec.nodeSelector key"},
		{"port", func(p *fxv1.TransferPool) { p.Spec.Agent.Port = 65534 }, "spec.agent.port"},
		{"1-byte memory limit", func(p *fxv1.TransferPool) {
			p.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1")}}
		}, "spec.agent.resources.limits.memory"},
		{"a memory limit below the host pool memory", func(p *fxv1.TransferPool) {
			p.Spec.Memory.HostStaging = ptr(resource.MustParse("4Gi"))
			p.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
		}, "must leave room for spec.memory.hostStaging 4Gi"},
		{"GPUs for the agent", func(p *fxv1.TransferPool) {
			p.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}
		}, "only cpu, memory and ephemeral-storage"},
	} {
		pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
		tc.edit(pool)
		err := ValidatePool(pool, AgentSettings{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want a refusal naming %q", tc.name, err, tc.want)
		}
	}
}

// TestAMemoryLimitWithRoomForHostStagingIsValid: a limit above the host pool memory and the agent's own is taken.
func TestAMemoryLimitWithRoomForHostStagingIsValid(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	pool.Spec.Memory.HostStaging = ptr(resource.MustParse("1Gi"))
	pool.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}
	if err := ValidatePool(pool, AgentSettings{}); err != nil {
		t.Fatalf("a 2Gi limit beside 1Gi of host pool memory: %v", err)
	}
}

// TestValidateMPSDirs: the operator refuses MPS folders that would mount something nobody asked for (a relative,
// unclean or root path, one over a folder the agent mounts itself) or that would not make the agent join MPS.
func TestValidateMPSDirs(t *testing.T) {
	for _, bad := range [][2]string{
		{"run/nvidia/mps", ""}, {"/", ""}, {"/run/nvidia/mps/", ""}, {"/run/nvidia/../mps", ""}, {"/run//mps", ""},
		{"/dev", ""}, {"/dev/mps", ""}, {"/host", ""}, {"/host/run/mps", ""}, {"/run/fabricxfer/mps", ""}, {"/run", ""},
		{"/etc/fabricxfer/tls", ""}, {"/var/cache", ""},
		{"/run/nvidia/mps", "shm"}, {"/run/nvidia/mps", "/run/nvidia/mps/shm/"}, {"", "/run/nvidia/mps/shm"},
	} {
		if ValidateMPSDirs(bad[0], bad[1]) == nil {
			t.Errorf("pipe %q, shm %q accepted", bad[0], bad[1])
		}
	}
	for _, good := range [][2]string{{"", ""}, {"/run/nvidia/mps", ""}, {"/run/nvidia/mps/pipe", "/run/nvidia/mps/shm"}, {"/tmp/nvidia-mps", ""}} {
		if err := ValidateMPSDirs(good[0], good[1]); err != nil {
			t.Errorf("pipe %q, shm %q: %v", good[0], good[1], err)
		}
	}
}
