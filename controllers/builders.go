// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

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

// AgentSettings are operator-wide defaults for agent DaemonSets.
type AgentSettings struct {
	// Image is used when a pool names none.
	Image string
}

// agentName is the name of every namespaced object the operator owns for a pool.
func agentName(pool *fxv1.TransferPool) string { return "fabricxfer-agent-" + pool.Name }

// clusterRBACName is the name of the pool's cluster-scoped ClusterRole and ClusterRoleBinding; cluster-scoped
// objects cannot be owned by a namespaced pool, so the pool's finalizer removes them.
func clusterRBACName(pool *fxv1.TransferPool) string {
	return fmt.Sprintf("fabricxfer-agent-%s-%s", pool.Namespace, pool.Name)
}

// tlsSecretName is the Secret that holds the pool's agent-to-agent certificates.
func tlsSecretName(pool *fxv1.TransferPool) string { return "fabricxfer-agent-" + pool.Name + "-tls" }

func poolLabels(pool *fxv1.TransferPool) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "fabricxfer-agent",
		"app.kubernetes.io/instance":   pool.Name,
		"app.kubernetes.io/managed-by": "fabricxfer-operator",
		fxv1.LabelPoolName:             pool.Name,
		fxv1.LabelPoolNamespace:        pool.Namespace,
	}
}

func selectorLabels(pool *fxv1.TransferPool) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "fabricxfer-agent", fxv1.LabelPoolName: pool.Name}
}

func ownerRef(pool *fxv1.TransferPool) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(fxv1.GroupVersion.String()).WithKind("TransferPool").
		WithName(pool.Name).WithUID(pool.UID).
		WithController(true).WithBlockOwnerDeletion(true)
}

// DesiredServiceAccount is the identity agents of the pool run as.
func DesiredServiceAccount(pool *fxv1.TransferPool) *corev1ac.ServiceAccountApplyConfiguration {
	return corev1ac.ServiceAccount(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool))
}

// DesiredRole lets agents read their pool and its certificates and renew their heartbeat Leases in the pool's
// namespace. Lease names are per node, so the rule cannot name them; an agent runs privileged on its host
// already, so write access to the namespace's Leases gives it nothing more.
func DesiredRole(pool *fxv1.TransferPool) *rbacv1ac.RoleApplyConfiguration {
	return rbacv1ac.Role(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool)).
		WithRules(
			rbacv1ac.PolicyRule().WithAPIGroups(fxv1.GroupVersion.Group).WithResources("transferpools").
				WithResourceNames(pool.Name).WithVerbs("get", "list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("secrets").
				WithResourceNames(tlsSecretName(pool)).WithVerbs("get", "list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases").
				WithVerbs("get", "create", "update"),
		)
}

// DesiredRoleBinding binds DesiredRole to the agents' ServiceAccount.
func DesiredRoleBinding(pool *fxv1.TransferPool) *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("Role").WithName(agentName(pool))).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(agentName(pool)).WithNamespace(pool.Namespace))
}

// DesiredClusterRole lets agents write TransferNodes, read Nodes (their owner) and peers' reports, and map a
// socket caller's pod UID to its namespace.
func DesiredClusterRole(pool *fxv1.TransferPool) *rbacv1ac.ClusterRoleApplyConfiguration {
	return rbacv1ac.ClusterRole(clusterRBACName(pool)).
		WithLabels(poolLabels(pool)).
		WithRules(
			rbacv1ac.PolicyRule().WithAPIGroups(fxv1.GroupVersion.Group).WithResources("transfernodes").
				WithVerbs("get", "list", "watch", "create", "patch", "update"),
			rbacv1ac.PolicyRule().WithAPIGroups(fxv1.GroupVersion.Group).WithResources("transfernodes/status").
				WithVerbs("get", "patch", "update"),
			rbacv1ac.PolicyRule().WithAPIGroups(fxv1.GroupVersion.Group).WithResources("vpodtopologies").
				WithVerbs("get", "list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes").WithVerbs("get", "list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("pods").WithVerbs("get", "list", "watch"),
		)
}

// DesiredClusterRoleBinding binds DesiredClusterRole to the agents' ServiceAccount.
func DesiredClusterRoleBinding(pool *fxv1.TransferPool) *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(clusterRBACName(pool)).
		WithLabels(poolLabels(pool)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(clusterRBACName(pool))).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(agentName(pool)).WithNamespace(pool.Namespace))
}

// DesiredDaemonSet runs one agent on every node the pool selects.
func DesiredDaemonSet(pool *fxv1.TransferPool, settings AgentSettings) *appsv1ac.DaemonSetApplyConfiguration {
	spec := pool.Spec
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
	}
	if spec.FabricDomainOverride != "" {
		args = append(args, "--fabric-domain="+spec.FabricDomainOverride)
	}
	// Pool memory in bytes: the agent allocates it at start and lends it (AllocateFromPool).
	for _, m := range []struct {
		flag string
		q    *resource.Quantity
	}{
		{"--pool-gpu-bytes", spec.Memory.PerGPU},
		{"--pool-host-bytes", spec.Memory.HostStaging},
		{"--max-registered-bytes", spec.Memory.MaxRegisteredPerCaller},
	} {
		if m.q != nil && m.q.Sign() > 0 {
			args = append(args, m.flag+"="+strconv.FormatInt(m.q.Value(), 10))
		}
	}

	// Host pool memory is shared memory charged to the agent's cgroup: the default limit makes room for it.
	memLimit := resource.MustParse("512Mi")
	if q := spec.Memory.HostStaging; q != nil && q.Sign() > 0 {
		memLimit.Add(*q)
	}
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

	container := corev1ac.Container().
		WithName("agent").WithImage(image).WithImagePullPolicy(pullPolicy).
		WithArgs(args...).
		WithEnv(
			env("NODE_NAME", "spec.nodeName"),
			env("HOST_IP", "status.hostIP"),
			env("POD_NAMESPACE", "metadata.namespace"),
			env("POD_NAME", "metadata.name"),
			// The NVIDIA container runtime injects every GPU and the driver's user-space libraries.
			corev1ac.EnvVar().WithName("NVIDIA_VISIBLE_DEVICES").WithValue("all"),
			corev1ac.EnvVar().WithName("NVIDIA_DRIVER_CAPABILITIES").WithValue("compute,utility"),
		).
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
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("host-root").WithMountPath(agentHostRootMount).WithReadOnly(true).
				WithMountPropagation(corev1.MountPropagationHostToContainer),
			corev1ac.VolumeMount().WithName("sockets").WithMountPath(agentSocketMount),
			corev1ac.VolumeMount().WithName("dev").WithMountPath("/dev"),
			corev1ac.VolumeMount().WithName("tls").WithMountPath(agentTLSMount).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("kernel-cache").WithMountPath(agentKernelCache),
		)

	podSpec := corev1ac.PodSpec().
		WithServiceAccountName(agentName(pool)).
		// Host network: peers reach the agent on the node address it advertises. Host PID: SO_PEERCRED gives
		// host PIDs, which identify the calling pod through /proc/<pid>/cgroup.
		WithHostNetwork(true).WithHostPID(true).WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		WithNodeSelector(spec.NodeSelector).
		WithContainers(container).
		WithVolumes(
			hostPath("host-root", "/", corev1.HostPathDirectory),
			hostPath("sockets", socketDir, corev1.HostPathDirectoryOrCreate),
			hostPath("dev", "/dev", corev1.HostPathDirectory),
			corev1ac.Volume().WithName("tls").WithSecret(corev1ac.SecretVolumeSource().
				WithSecretName(tlsSecretName(pool)).WithOptional(true)),
			corev1ac.Volume().WithName("kernel-cache").WithEmptyDir(corev1ac.EmptyDirVolumeSource()),
		)
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

	return appsv1ac.DaemonSet(agentName(pool), pool.Namespace).
		WithLabels(poolLabels(pool)).WithOwnerReferences(ownerRef(pool)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(pool))).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType("RollingUpdate").
				WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().WithMaxUnavailable(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(poolLabels(pool)).
				WithSpec(podSpec)))
}
