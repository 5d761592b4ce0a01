// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Paths inside the agent container. The host side of each mount comes from the pool.
const (
	agentHostRootMount  = "/host"
	agentSocketMount    = "/run/fabricxfer"
	agentTLSMount       = "/etc/fabricxfer/tls"
	agentKernelCache    = "/var/cache/fabricxfer"
	agentHealthPortName = "health"
)

// DefaultAgentNamespace is where agents run when the operator is told nothing else (and runs outside a pod).
const DefaultAgentNamespace = "fabricxfer-system"

// AgentClusterRole is the ClusterRole the chart and config/rbac install for every agent: write TransferNodes,
// read Nodes, VPodTopologies and Pods. The operator may only bind this role (RBAC `bind` with this resource
// name); it creates no ClusterRole and holds no `escalate`.
const AgentClusterRole = "fabricxfer-agent"

// AgentSettings are what the cluster admin decided at install for every pool's agents; a pool's author
// cannot change them.
type AgentSettings struct {
	// Image is used when a pool names none.
	Image string
	// ImageAllowlist are the other images a pool may name: exact references, or prefixes ending in '*'.
	ImageAllowlist []string
	// SocketDirPrefix is the host directory every pool's socketDir must be or lie under; empty is
	// fxv1.DefaultSocketDir.
	SocketDirPrefix string
	// Namespace is where every pool's agents, their ServiceAccount and certificates live; empty is
	// DefaultAgentNamespace. Never a tenant's namespace: whoever can exec into a pod, read a Secret or create a
	// pod with the agents' ServiceAccount there would be root on the pool's nodes or speak for its agents.
	Namespace string
	// DRA runs each agent's fabricxfer.io DRA driver (agent --dra): its node's ResourceSlice and claim
	// preparation for the kubelet, with the kubelet's plugin folders and the CDI folder mounted.
	DRA bool
	// NodeCerts has each agent obtain its own certificate, naming its node, from the operator (agent
	// --node-cert); the agents' Secret then holds only the CA bundle. Off: the Secret holds a key pair an admin
	// provides, shared by the pool's agents.
	NodeCerts bool
	// MPSPipeDir is the host folder of the NVIDIA MPS control daemon's pipes (its CUDA_MPS_PIPE_DIRECTORY) the
	// agents join: mounted at the same path and set for the agent, so its GPU copies run beside the inference
	// pods' kernels instead of waiting for their timeslices. Empty: no MPS.
	MPSPipeDir string
	// MPSShmDir is the host folder the MPS server and its clients share as /dev/shm (the NVIDIA device plugin's
	// MPS daemon keeps one under /run/nvidia/mps); empty: the host's /dev/shm, which the agent sees through its
	// /dev mount.
	MPSShmDir string
}

// Host folders of the kubelet's DRA plugins and of CDI specs, mounted at the same paths (agent --dra).
const (
	kubeletPluginsDir  = "/var/lib/kubelet/plugins"
	kubeletRegistryDir = "/var/lib/kubelet/plugins_registry"
	cdiDir             = "/var/run/cdi"
)

func (s AgentSettings) socketDirPrefix() string {
	if s.SocketDirPrefix == "" {
		return fxv1.DefaultSocketDir
	}
	return s.SocketDirPrefix
}

func (s AgentSettings) namespace() string {
	if s.Namespace == "" {
		return DefaultAgentNamespace
	}
	return s.Namespace
}

// AgentObjectName is the name of every object the operator owns for a pool, in the agents' namespace, the
// pool's namespace and cluster-wide: readable (namespace and name, cut to fit) and 16 hex digits of the
// SHA-256 of namespace/name, so team/a-x and team-a/x never share one. At most 63 characters, a valid name of
// every kind it is used for (a DaemonSet's pods and revisions add a suffix to it).
func AgentObjectName(poolNamespace, poolName string) string {
	readable := strings.Trim(poolNamespace+"-"+poolName, "-")
	if len(readable) > 29 {
		readable = strings.TrimRight(readable[:29], "-")
	}
	sum := sha256.Sum256([]byte(poolNamespace + "/" + poolName))
	return "fabricxfer-agent-" + readable + "-" + hex.EncodeToString(sum[:8])
}

// agentName is AgentObjectName of the pool.
func agentName(pool *fxv1.TransferPool) string { return AgentObjectName(pool.Namespace, pool.Name) }

// tlsSecretName is the Secret, in the agents' namespace, that holds the pool's agent-to-agent certificates.
func tlsSecretName(pool *fxv1.TransferPool) string { return agentName(pool) + "-tls" }

// managedBy marks every object the operator owns; the operator's informers select on it.
const managedBy = "fabricxfer-operator"

func poolLabels(pool *fxv1.TransferPool) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "fabricxfer-agent",
		"app.kubernetes.io/instance":   pool.Name,
		"app.kubernetes.io/managed-by": managedBy,
		fxv1.LabelPoolName:             pool.Name,
		fxv1.LabelPoolNamespace:        pool.Namespace,
	}
}

// ownerLabels select what belongs to one pool: objects outside the pool's namespace carry no owner reference,
// so the finalizer finds them by these labels and deletes nothing else.
func ownerLabels(pool *fxv1.TransferPool) client.MatchingLabels {
	return client.MatchingLabels{"app.kubernetes.io/managed-by": managedBy,
		fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: pool.Namespace}
}

func selectorLabels(pool *fxv1.TransferPool) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "fabricxfer-agent",
		fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: pool.Namespace}
}

func ownerRef(pool *fxv1.TransferPool) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(fxv1.GroupVersion.String()).WithKind("TransferPool").
		WithName(pool.Name).WithUID(pool.UID).
		WithController(true).WithBlockOwnerDeletion(true)
}

// DesiredServiceAccount is the identity agents of the pool run as, in the agents' namespace. Its token is
// mounted only into the pool's agent pods; no tenant can create a pod that uses it.
func DesiredServiceAccount(pool *fxv1.TransferPool, settings AgentSettings) *corev1ac.ServiceAccountApplyConfiguration {
	return corev1ac.ServiceAccount(agentName(pool), settings.namespace()).WithLabels(poolLabels(pool))
}

// DesiredRole lets agents read their pool and renew their heartbeat Leases, in the pool's namespace. Lease
// names are per node, so the rule cannot name them. Agents read no Secret through the API: the kubelet
// mounts their certificates.
func DesiredRole(pool *fxv1.TransferPool) *rbacv1ac.RoleApplyConfiguration {
	return rbacv1ac.Role(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool)).
		WithRules(
			rbacv1ac.PolicyRule().WithAPIGroups(fxv1.GroupVersion.Group).WithResources("transferpools").
				WithResourceNames(pool.Name).WithVerbs("get", "list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases").
				WithVerbs("get", "create", "update"),
		)
}

// DesiredRoleBinding binds DesiredRole to the agents' ServiceAccount in the agents' namespace.
func DesiredRoleBinding(pool *fxv1.TransferPool, settings AgentSettings) *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("Role").WithName(agentName(pool))).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(agentName(pool)).WithNamespace(settings.namespace()))
}

// DesiredClusterRoleBinding binds the installed AgentClusterRole to the pool's agents. Cluster-scoped objects
// cannot be owned by a namespaced pool, so the pool's finalizer removes it (by its owner labels).
func DesiredClusterRoleBinding(pool *fxv1.TransferPool, settings AgentSettings) *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(agentName(pool)).
		WithLabels(poolLabels(pool)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(AgentClusterRole)).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(agentName(pool)).WithNamespace(settings.namespace()))
}

// DesiredDaemonSet runs one agent on every node the pool selects. It refuses (ValidatePool) a pool whose
// values would make flags or mounts nobody asked for.
func DesiredDaemonSet(pool *fxv1.TransferPool, settings AgentSettings) (*appsv1ac.DaemonSetApplyConfiguration, error) {
	if err := ValidatePool(pool, settings); err != nil {
		return nil, err
	}
	spec := pool.Spec
	mem, err := memoryBytes(spec.Memory)
	if err != nil {
		return nil, err
	}
	image := spec.Agent.Image
	if image == "" {
		image = settings.Image
	}
	socketDir := spec.SocketDir
	if socketDir == "" {
		socketDir = fxv1.DefaultSocketDir
	}
	heartbeat := spec.Agent.HeartbeatSeconds
	if heartbeat == 0 {
		heartbeat = 10
	}
	port := spec.Agent.Port
	if port == 0 {
		port = 7470
	}
	engines := spec.Engines
	if len(engines) == 0 {
		engines = fxv1.AllEngines
	}
	engineList := ""
	for i, e := range engines {
		if i > 0 {
			engineList += ","
		}
		engineList += string(e)
	}

	args := []string{
		"run",
		"--host-root=" + agentHostRootMount,
		"--node-name=$(NODE_NAME)",
		"--pool-namespace=" + pool.Namespace,
		"--pool-name=" + pool.Name,
		"--socket-dir=" + agentSocketMount,
		"--engines=" + engineList,
		"--heartbeat=" + strconv.Itoa(int(heartbeat)) + "s",
		"--peer-listen=:" + strconv.Itoa(int(port)),
		"--endpoint=$(HOST_IP):" + strconv.Itoa(int(port)),
		"--data-listen=:" + strconv.Itoa(int(port)+1),
		"--data-advertise=$(HOST_IP):" + strconv.Itoa(int(port)+1),
		"--health-addr=:" + strconv.Itoa(int(port)+2),
		"--tls-dir=" + agentTLSMount,
		"--kernel-cache=" + agentKernelCache,
		// JSON with the operator's keys, so one log pipeline reads both.
		"--log-format=json",
	}
	if settings.NodeCerts {
		args = append(args, "--node-cert")
	}
	if g := spec.SocketGroup; g != nil {
		// The agent gives this group the pool's socket directory and sockets; ValidatePool checked its bounds.
		args = append(args, "--socket-gid="+strconv.FormatInt(*g, 10))
	}
	if spec.FabricDomainOverride != "" {
		args = append(args, "--fabric-domain="+spec.FabricDomainOverride)
	}
	if us := spec.Agent.PollMicroseconds; us != nil {
		// Unset leaves the agent's own default, so pools that never named it keep their DaemonSet as it was.
		args = append(args, "--fast-spin="+(time.Duration(*us)*time.Microsecond).String())
	}
	// Pool memory in bytes, checked by memoryBytes: the agent allocates it at start and lends it (AllocateFromPool).
	for _, m := range []struct {
		flag  string
		bytes int64
	}{
		{"--pool-gpu-bytes", mem.perGPU},
		{"--pool-host-bytes", mem.hostStaging},
		{"--max-registered-bytes", mem.maxRegistered},
	} {
		if m.bytes > 0 {
			args = append(args, m.flag+"="+strconv.FormatInt(m.bytes, 10))
		}
	}

	// Host pool memory is shared memory charged to the agent's cgroup: the default limit makes room for it.
	// hostStaging is at most 1 TiB, so the sum cannot overflow.
	memLimit := *resource.NewQuantity(512<<20+mem.hostStaging, resource.BinarySI)
	resources := corev1ac.ResourceRequirements().
		WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}).
		WithLimits(corev1.ResourceList{corev1.ResourceMemory: memLimit})
	if r := spec.Agent.Resources; r != nil {
		resources = corev1ac.ResourceRequirements().WithRequests(r.Requests).WithLimits(r.Limits)
	}
	pullPolicy := spec.Agent.ImagePullPolicy
	if pullPolicy == "" {
		pullPolicy = corev1.PullIfNotPresent
	}

	probe := func(path string, period int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString(agentHealthPortName))).
			WithPeriodSeconds(period).WithTimeoutSeconds(2).WithFailureThreshold(3)
	}
	env := func(name, fieldPath string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(fieldPath)))
	}
	hostPath := func(name, path string, kind corev1.HostPathType) *corev1ac.VolumeApplyConfiguration {
		return corev1ac.Volume().WithName(name).WithHostPath(corev1ac.HostPathVolumeSource().WithPath(path).WithType(kind))
	}

	mounts := []*corev1ac.VolumeMountApplyConfiguration{
		corev1ac.VolumeMount().WithName("host-root").WithMountPath(agentHostRootMount).WithReadOnly(true).
			WithMountPropagation(corev1.MountPropagationHostToContainer),
		corev1ac.VolumeMount().WithName("sockets").WithMountPath(agentSocketMount),
		corev1ac.VolumeMount().WithName("dev").WithMountPath("/dev"),
		corev1ac.VolumeMount().WithName("tls").WithMountPath(agentTLSMount).WithReadOnly(true),
		corev1ac.VolumeMount().WithName("kernel-cache").WithMountPath(agentKernelCache),
	}
	volumes := []*corev1ac.VolumeApplyConfiguration{
		hostPath("host-root", "/", corev1.HostPathDirectory),
		hostPath("sockets", socketDir, corev1.HostPathDirectoryOrCreate),
		hostPath("dev", "/dev", corev1.HostPathDirectory),
		corev1ac.Volume().WithName("tls").WithSecret(corev1ac.SecretVolumeSource().
			WithSecretName(tlsSecretName(pool)).WithOptional(true)),
		corev1ac.Volume().WithName("kernel-cache").WithEmptyDir(corev1ac.EmptyDirVolumeSource()),
	}
	if settings.DRA {
		// The CDI spec of a prepared claim names the pool's socket folder as the host sees it.
		args = append(args, "--dra", "--dra-host-socket-dir="+path.Join(socketDir, pool.Name),
			"--kubelet-plugin-dir="+path.Join(kubeletPluginsDir, "fabricxfer.io"),
			"--kubelet-registry-dir="+kubeletRegistryDir, "--cdi-dir="+cdiDir)
		for _, d := range []struct{ name, path string }{{"kubelet-plugins", kubeletPluginsDir},
			{"kubelet-registry", kubeletRegistryDir}, {"cdi", cdiDir}} {
			mounts = append(mounts, corev1ac.VolumeMount().WithName(d.name).WithMountPath(d.path))
			volumes = append(volumes, hostPath(d.name, d.path, corev1.HostPathDirectoryOrCreate))
		}
	}

	containerEnv := []*corev1ac.EnvVarApplyConfiguration{
		env("NODE_NAME", "spec.nodeName"),
		env("HOST_IP", "status.hostIP"),
		env("POD_NAMESPACE", "metadata.namespace"),
		env("POD_NAME", "metadata.name"),
		// The NVIDIA container runtime injects every GPU and the driver's user-space libraries.
		corev1ac.EnvVar().WithName("NVIDIA_VISIBLE_DEVICES").WithValue("all"),
		corev1ac.EnvVar().WithName("NVIDIA_DRIVER_CAPABILITIES").WithValue("compute,utility"),
	}
	if settings.MPSPipeDir != "" {
		// The CUDA driver joins the MPS server whose control daemon listens in this folder. Created when missing,
		// so a node without the daemon still runs its agent, which then says its GPUs are time-sliced.
		containerEnv = append(containerEnv, corev1ac.EnvVar().WithName("CUDA_MPS_PIPE_DIRECTORY").WithValue(settings.MPSPipeDir))
		mounts = append(mounts, corev1ac.VolumeMount().WithName("mps-pipe").WithMountPath(settings.MPSPipeDir))
		volumes = append(volumes, hostPath("mps-pipe", settings.MPSPipeDir, corev1.HostPathDirectoryOrCreate))
		if settings.MPSShmDir != "" {
			mounts = append(mounts, corev1ac.VolumeMount().WithName("mps-shm").WithMountPath("/dev/shm"))
			volumes = append(volumes, hostPath("mps-shm", settings.MPSShmDir, corev1.HostPathDirectory))
		}
	}

	container := corev1ac.Container().
		WithName("agent").WithImage(image).WithImagePullPolicy(pullPolicy).
		WithArgs(args...).
		WithEnv(containerEnv...).
		WithPorts(
			corev1ac.ContainerPort().WithName("agent").WithContainerPort(port).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("data").WithContainerPort(port+1).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName(agentHealthPortName).WithContainerPort(port+2).WithProtocol(corev1.ProtocolTCP),
		).
		WithResources(resources).
		WithReadinessProbe(probe("/readyz", 10)).
		WithLivenessProbe(probe("/healthz", 20)).
		// Privileged for /dev/kfd, /dev/dri and /dev/infiniband (AMD GPUs and verbs have no device plugin path
		// the agent could use for every GPU) and for pinning registered memory.
		WithSecurityContext(corev1ac.SecurityContext().WithPrivileged(true).WithReadOnlyRootFilesystem(true)).
		WithVolumeMounts(mounts...)

	podSpec := corev1ac.PodSpec().
		WithServiceAccountName(agentName(pool)).
		// Host network: peers reach the agent on the node address it advertises. Host PID: SO_PEERCRED gives
		// host PIDs, which identify the calling pod through /proc/<pid>/cgroup.
		WithHostNetwork(true).WithHostPID(true).WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		WithNodeSelector(spec.NodeSelector).
		WithContainers(container).
		WithVolumes(volumes...)
	if spec.Agent.PriorityClassName != "" {
		podSpec.WithPriorityClassName(spec.Agent.PriorityClassName)
	}
	for i := range spec.Tolerations {
		t := spec.Tolerations[i]
		tol := corev1ac.Toleration().WithKey(t.Key).WithOperator(t.Operator).WithValue(t.Value).WithEffect(t.Effect)
		if t.TolerationSeconds != nil {
			tol.WithTolerationSeconds(*t.TolerationSeconds)
		}
		podSpec.WithTolerations(tol)
	}

	return appsv1ac.DaemonSet(agentName(pool), settings.namespace()).
		WithLabels(poolLabels(pool)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(pool))).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType("RollingUpdate").
				WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().WithMaxUnavailable(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(poolLabels(pool)).
				WithSpec(podSpec))), nil
}
