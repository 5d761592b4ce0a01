// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/")

func samplePool() *fxv1.TransferPool {
	return &fxv1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "inference", Name: "kv-cache", UID: types.UID("7f9c1e2a-0000-4000-8000-000000000001")},
		Spec: fxv1.TransferPoolSpec{
			NodeSelector:         map[string]string{"fabricxfer.io/gpu-node": "true"},
			Tolerations:          []corev1.Toleration{{Key: "amd.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Engines:              []fxv1.EngineName{fxv1.EngineXGMI, fxv1.EngineFabric, fxv1.EngineTCP},
			SocketDir:            "/var/run/fabricxfer",
			FabricDomainOverride: "ualink:1/7",
			Memory: fxv1.PoolMemory{PerGPU: ptr(resource.MustParse("64Gi")), HostStaging: ptr(resource.MustParse("2Gi")),
				MaxRegisteredPerCaller: ptr(resource.MustParse("1Gi"))},
			Agent: fxv1.AgentSpec{Image: "ghcr.io/fabricxfer/agent:v0.1.0", HeartbeatSeconds: 10, Port: 7470, PriorityClassName: "system-node-critical"},
		},
	}
}

func TestBuildersMatchGolden(t *testing.T) {
	pool := samplePool()
	settings := AgentSettings{Image: "unused", ImageAllowlist: []string{"ghcr.io/fabricxfer/agent:*"}, Namespace: "fabricxfer-system", NodeCerts: true}
	objects := map[string]any{
		"daemonset.yaml": mustDaemonSet(t, pool, settings),
		// The same pool with a socket group: only the --socket-gid flag differs from daemonset.yaml.
		"daemonset-socketgroup.yaml": mustDaemonSet(t, withSocketGroup(pool, 4242), settings),
		"serviceaccount.yaml":        DesiredServiceAccount(pool, settings),
		"role.yaml":                  DesiredRole(pool),
		"rolebinding.yaml":           DesiredRoleBinding(pool, settings),
		"clusterrolebinding.yaml":    DesiredClusterRoleBinding(pool, settings),
	}
	for name, obj := range objects {
		got, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join("testdata", "golden", name)
		if *updateGolden {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("reading golden file (go test ./controllers -run Golden -update writes it): %v", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from %s:\n%s", name, path, got)
		}
	}
}

// TestDaemonSetPassesThePollTime: agent.pollMicroseconds reaches the agent as --fast-spin (0 included: never poll);
// unset, no flag, so the agent's default holds and a pool that never named it keeps its DaemonSet.
func TestDaemonSetPassesThePollTime(t *testing.T) {
	for _, tc := range []struct {
		us   *int32
		want string // the flag, or "" for none
	}{
		{nil, ""},
		{ptr(int32(0)), "--fast-spin=0s"},
		{ptr(int32(2000)), "--fast-spin=2ms"},
		{ptr(int32(100000)), "--fast-spin=100ms"},
	} {
		pool := samplePool()
		pool.Spec.Agent.PollMicroseconds = tc.us
		var got []string
		for _, a := range mustDaemonSet(t, pool, AgentSettings{Image: "unused", ImageAllowlist: []string{"ghcr.io/fabricxfer/agent:*"}}).Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--fast-spin") {
				got = append(got, a)
			}
		}
		if tc.want == "" && len(got) != 0 || tc.want != "" && (len(got) != 1 || got[0] != tc.want) {
			t.Errorf("pollMicroseconds %v: args %v, want %q", tc.us, got, tc.want)
		}
	}
}

func TestDaemonSetDefaultsWhenThePoolSaysLittle(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	ds := mustDaemonSet(t, pool, AgentSettings{Image: "registry.local/agent:dev"})
	c := ds.Spec.Template.Spec.Containers[0]
	if *c.Image != "registry.local/agent:dev" {
		t.Errorf("image %q, want the operator default", *c.Image)
	}
	args := map[string]bool{}
	for _, a := range c.Args {
		args[a] = true
	}
	for _, want := range []string{"--engines=xgmi,fabric,rdma,tcp", "--heartbeat=10s", "--peer-listen=:7470", "--data-listen=:7471", "--health-addr=:7472", "--socket-dir=/run/fabricxfer"} {
		if !args[want] {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	var socketPath string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if *v.Name == "sockets" {
			socketPath = *v.HostPath.Path
		}
	}
	if socketPath != fxv1.DefaultSocketDir {
		t.Errorf("socket hostPath %q, want %q", socketPath, fxv1.DefaultSocketDir)
	}
	if c.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("cpu request %s", c.Resources.Requests.Cpu())
	}
}

func ptr[T any](v T) *T { return &v }

// withSocketGroup is a copy of pool with spec.socketGroup set.
func withSocketGroup(pool *fxv1.TransferPool, gid int64) *fxv1.TransferPool {
	p := pool.DeepCopy()
	p.Spec.SocketGroup = &gid
	return p
}

// TestDaemonSetGivesTheSocketsThePoolsGroup checks that spec.socketGroup reaches the agent as --socket-gid, that a
// pool without one gets no flag (the agent keeps root's group), and that a group out of bounds writes nothing.
func TestDaemonSetGivesTheSocketsThePoolsGroup(t *testing.T) {
	settings := AgentSettings{Image: "registry.local/agent:dev"}
	base := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	gidArgs := func(ds *appsv1ac.DaemonSetApplyConfiguration) []string {
		var out []string
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--socket-gid") {
				out = append(out, a)
			}
		}
		return out
	}
	if got := gidArgs(mustDaemonSet(t, base, settings)); len(got) != 0 {
		t.Errorf("a pool without socketGroup got %v", got)
	}
	for _, gid := range []int64{1, 4242, 2147483647} {
		want := "--socket-gid=" + strconv.FormatInt(gid, 10)
		if got := gidArgs(mustDaemonSet(t, withSocketGroup(base, gid), settings)); len(got) != 1 || got[0] != want {
			t.Errorf("socketGroup %d: args %v, want exactly %s", gid, got, want)
		}
	}
	for _, gid := range []int64{0, -1, 2147483648, 1 << 32, -1 << 63} {
		ds, err := DesiredDaemonSet(withSocketGroup(base, gid), settings)
		if err == nil {
			t.Errorf("socketGroup %d: built a DaemonSet with %v", gid, gidArgs(ds))
			continue
		}
		if !strings.Contains(err.Error(), "spec.socketGroup") {
			t.Errorf("socketGroup %d: refused with %q, want it to name spec.socketGroup", gid, err)
		}
	}
}

func mustDaemonSet(t *testing.T, pool *fxv1.TransferPool, settings AgentSettings) *appsv1ac.DaemonSetApplyConfiguration {
	t.Helper()
	ds, err := DesiredDaemonSet(pool, settings)
	if err != nil {
		t.Fatalf("building the DaemonSet: %v", err)
	}
	return ds
}

// TestOwnedNamesNeverCollide checks the names of owned objects: pools whose namespace and name join into the
// same words (team/a-x and team-a/x) once shared a ClusterRole, and deleting one removed the other's.
func TestOwnedNamesNeverCollide(t *testing.T) {
	a, b := AgentObjectName("team", "a-x"), AgentObjectName("team-a", "x")
	if a == b {
		t.Fatalf("team/a-x and team-a/x share the name %s", a)
	}
	long := AgentObjectName(strings.Repeat("n", 63), strings.Repeat("p", 63))
	if len(long) > 63 || validation.IsDNS1123Label(long) != nil {
		t.Errorf("name %q of the longest pool is not a DNS label of at most 63 characters: %v", long, validation.IsDNS1123Label(long))
	}
	if AgentObjectName(strings.Repeat("n", 63), strings.Repeat("p", 62)+"q") == long {
		t.Error("pools that differ only past the readable part share a name")
	}
	if got := AgentObjectName("default", "kv-cache"); !strings.HasPrefix(got, "fabricxfer-agent-default-kv-cache-") {
		t.Errorf("name %q should stay readable", got)
	}
}

// TestOwnedNamesMatchTheScripts checks that hack/names.sh, which the end-to-end and failure scripts use to find
// a pool's objects, names them as the operator does.
func TestOwnedNamesMatchTheScripts(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, p := range [][2]string{{"default", "kv-cache"}, {"team", "a-x"}, {strings.Repeat("n", 40), "p"}, {"ns", strings.Repeat("p-", 14) + "q"}} {
		out, err := exec.CommandContext(context.Background(), "bash", "-c", `source ../hack/names.sh && agent_object_name "$0" "$1"`, p[0], p[1]).Output()
		if err != nil {
			t.Fatalf("hack/names.sh: %v", err)
		}
		if got, want := strings.TrimSpace(string(out)), AgentObjectName(p[0], p[1]); got != want {
			t.Errorf("hack/names.sh names %s/%s %q, the operator %q", p[0], p[1], got, want)
		}
	}
}

// TestDaemonSetRunsTheDRADriverWhenAsked: with AgentSettings.DRA the agents get --dra, the pool's socket folder
// as the host sees it (what a prepared claim's CDI spec mounts) and the kubelet's plugin, registry and CDI
// folders at their host paths; without it none of them.
func TestDaemonSetRunsTheDRADriverWhenAsked(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kv"},
		Spec: fxv1.TransferPoolSpec{SocketDir: fxv1.DefaultSocketDir + "/team"}}
	for _, dra := range []bool{false, true} {
		ds := mustDaemonSet(t, pool, AgentSettings{Image: "registry.local/agent:dev", DRA: dra})
		spec := ds.Spec.Template.Spec
		args := strings.Join(spec.Containers[0].Args, " ")
		wantArgs := []string{"--dra", "--dra-host-socket-dir=" + fxv1.DefaultSocketDir + "/team/kv",
			"--kubelet-plugin-dir=/var/lib/kubelet/plugins/fabricxfer.io", "--kubelet-registry-dir=/var/lib/kubelet/plugins_registry", "--cdi-dir=/var/run/cdi"}
		for _, a := range wantArgs {
			if strings.Contains(args, a) != dra {
				t.Errorf("dra=%v: args %q contain %s: %v", dra, args, a, !dra)
			}
		}
		mounted := map[string]string{}
		for _, m := range spec.Containers[0].VolumeMounts {
			mounted[*m.Name] = *m.MountPath
		}
		hosts := map[string]string{}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hosts[*v.Name] = *v.HostPath.Path
			}
		}
		for name, p := range map[string]string{"kubelet-plugins": "/var/lib/kubelet/plugins", "kubelet-registry": "/var/lib/kubelet/plugins_registry", "cdi": "/var/run/cdi"} {
			if got := mounted[name] == p && hosts[name] == p; got != dra {
				t.Errorf("dra=%v: %s mounted at %q from host %q, want %s there: %v", dra, name, mounted[name], hosts[name], p, dra)
			}
		}
	}
}

// TestDaemonSetJoinsMPSWhenAsked: with the admin's MPS folders the agent gets the pipe folder at its host path and
// CUDA_MPS_PIPE_DIRECTORY naming it, and the shared memory folder as /dev/shm; without them, neither.
func TestDaemonSetJoinsMPSWhenAsked(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kv"}}
	for _, tc := range []struct {
		name          string
		pipe, shm     string
		wantEnv       string
		wantMounts    map[string]string // volume name -> mount path
		wantHostPaths map[string]string // volume name -> host path
	}{
		{"no MPS", "", "", "", nil, nil},
		{"pipe folder", "/run/nvidia/mps", "", "/run/nvidia/mps",
			map[string]string{"mps-pipe": "/run/nvidia/mps"}, map[string]string{"mps-pipe": "/run/nvidia/mps"}},
		{"pipe and shared memory folders", "/run/nvidia/mps/pipe", "/run/nvidia/mps/shm", "/run/nvidia/mps/pipe",
			map[string]string{"mps-pipe": "/run/nvidia/mps/pipe", "mps-shm": "/dev/shm"},
			map[string]string{"mps-pipe": "/run/nvidia/mps/pipe", "mps-shm": "/run/nvidia/mps/shm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := mustDaemonSet(t, pool, AgentSettings{Image: "registry.local/agent:dev", MPSPipeDir: tc.pipe, MPSShmDir: tc.shm})
			spec := ds.Spec.Template.Spec
			c := spec.Containers[0]
			env := ""
			for _, e := range c.Env {
				if *e.Name == "CUDA_MPS_PIPE_DIRECTORY" {
					env = *e.Value
				}
			}
			if env != tc.wantEnv {
				t.Errorf("CUDA_MPS_PIPE_DIRECTORY %q, want %q", env, tc.wantEnv)
			}
			mounts, hosts := map[string]string{}, map[string]string{}
			for _, m := range c.VolumeMounts {
				if strings.HasPrefix(*m.Name, "mps-") {
					mounts[*m.Name] = *m.MountPath
				}
			}
			for _, v := range spec.Volumes {
				if strings.HasPrefix(*v.Name, "mps-") && v.HostPath != nil {
					hosts[*v.Name] = *v.HostPath.Path
				}
			}
			if fmt.Sprint(mounts) != fmt.Sprint(orEmpty(tc.wantMounts)) || fmt.Sprint(hosts) != fmt.Sprint(orEmpty(tc.wantHostPaths)) {
				t.Errorf("MPS mounts %v from host %v, want %v from %v", mounts, hosts, tc.wantMounts, tc.wantHostPaths)
			}
		})
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// TestDaemonSetWithMPSAcceptedByTheAPIServer: the agents' DaemonSet with both MPS folders passes a real API
// server's validation (server-side apply, dry run): no mount path clashes with the agent's own, /dev/shm inside
// the /dev mount included.
func TestDaemonSetWithMPSAcceptedByTheAPIServer(t *testing.T) {
	c := apiClient(t)
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kv"}}
	settings := testAgentSettings
	settings.MPSPipeDir, settings.MPSShmDir = "/run/nvidia/mps/pipe", "/run/nvidia/mps/shm"
	ds := mustDaemonSet(t, pool, settings)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Apply(ctx, ds, client.FieldOwner(FieldManager), client.ForceOwnership, client.DryRunAll); err != nil {
		t.Fatalf("the API server refused the DaemonSet with MPS folders: %v", err)
	}
}
