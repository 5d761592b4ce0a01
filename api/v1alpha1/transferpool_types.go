// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultSocketDir is the host directory under which each pool's agent socket lives, as <dir>/<pool>/agent.sock.
// It is also the default of the admin's socket directory prefix: a pool's socketDir must be it or a directory
// under it (the chart writes another prefix into the CRD's rule and the operator's --socket-dir-prefix).
const DefaultSocketDir = "/var/run/fabricxfer"

// Bounds of the pool's quantities, in bytes. The CRD's CEL rules and ValidatePoolSpec state the same numbers:
// admission refuses what the operator would refuse before writing a flag.
const (
	// MinPoolGPUBytes is the least non-zero spec.memory.perGPU: one VMM allocation granularity.
	MinPoolGPUBytes = 2 << 20
	// MaxPoolGPUBytes bounds spec.memory.perGPU; no GPU has more than a TiB of memory.
	MaxPoolGPUBytes = 1 << 40
	// MinHostStagingBytes and MaxHostStagingBytes bound spec.memory.hostStaging, which also raises the
	// agent's memory limit.
	MinHostStagingBytes = 1 << 20
	MaxHostStagingBytes = 1 << 40
	// MinRegisteredPerCaller and MaxRegisteredPerCaller bound spec.memory.maxRegisteredPerCaller.
	MinRegisteredPerCaller = 1 << 20
	MaxRegisteredPerCaller = 16 << 40
	// MinAgentMemoryBytes is the least memory request or limit of the agent container: it maps the pool's
	// memory and holds gRPC buffers.
	MinAgentMemoryBytes = 64 << 20
	// MaxAgentMemoryBytes bounds the agent container's memory request and limit (host staging included).
	MaxAgentMemoryBytes = 2 << 40
)

// Bounds of spec.socketGroup. They are the group IDs a pod's securityContext.supplementalGroups accepts, so every
// group a pool names can be given to a pod. 0 (root's group) is refused: leaving the field unset already means
// root only, and a pool should not be able to ask for root's group by name.
const (
	MinSocketGroup = 1
	MaxSocketGroup = 2147483647
)

// TransferPoolSpec says which nodes run a transfer agent and what those agents may do.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.socketDir) || (has(self.socketDir) && self.socketDir == oldSelf.socketDir)",message="socketDir is immutable: pods that mounted the old directory would lose their agent"
type TransferPoolSpec struct {
	// NodeSelector picks the nodes that run an agent of this pool. Empty selects every node.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="nodeSelector keys must be label keys ([prefix/]name, name at most 63 characters)"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() <= 63)",message="nodeSelector values must be label values of at most 63 characters"
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations let agents run on tainted GPU nodes.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'])",message="a toleration's operator must be Exists or Equal"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.effect) || t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])",message="a toleration's effect must be NoSchedule, PreferNoSchedule or NoExecute"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')",message="a toleration with operator Exists must not have a value"
	// +kubebuilder:validation:XValidation:rule="self.all(t, has(t.key) && t.key != '' || has(t.operator) && t.operator == 'Exists')",message="a toleration without a key must have operator Exists"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.tolerationSeconds) || has(t.effect) && t.effect == 'NoExecute')",message="tolerationSeconds needs effect NoExecute"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.key) || size(t.key) <= 317)",message="a toleration's key is a qualified name: at most 317 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.value) || size(t.value) <= 63)",message="a toleration's value is a label value: at most 63 characters"
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Engines the agents may use, in any order; the composite always tries xgmi, fabric, rdma, tcp in that
	// order among those allowed. Leaving out tcp forbids staging through host memory.
	// +optional
	// +kubebuilder:default={xgmi,fabric,rdma,tcp}
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:XValidation:rule="self.all(e, self.exists_one(x, x == e))",message="engines must be unique"
	// +listType=atomic
	Engines []EngineName `json:"engines,omitempty"`

	// Memory bounds what the agent allocates and registers on each node.
	// +optional
	Memory PoolMemory `json:"memory,omitempty"`

	// SocketDir is the host directory that holds <socketDir>/<pool>/agent.sock. Pods mount the directory. It
	// is the admin's prefix (default /var/run/fabricxfer) or a directory under it, written in normal form:
	// the agent mounts it read-write and creates it, so it must never name a system directory.
	// +optional
	// +kubebuilder:default="/var/run/fabricxfer"
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^/var/run/fabricxfer(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$')",message="socketDir must be /var/run/fabricxfer or a directory under it, written without '.', '..', '//', a trailing '/' or a segment starting with '.'"
	SocketDir string `json:"socketDir,omitempty"`

	// SocketGroup is the group ID given the pool's socket directory (<socketDir>/<pool>, mode 0750) and its
	// sockets (mode 0660), so pods that do not run as root can connect: a pod joins the group through
	// securityContext.supplementalGroups (or runAsGroup). Unset, the directory and sockets belong to root's group
	// and only root in a pod can connect. A change takes effect when the agents restart with the new flag.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 2147483647",message="socketGroup must be a group ID between 1 and 2147483647 (0 is root's group: leave socketGroup unset instead)"
	SocketGroup *int64 `json:"socketGroup,omitempty"`

	// AllowedNamespaces may use this pool through the socket. Empty admits only the pool's own namespace;
	// "*" admits every namespace, and is then the list's only entry.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="!('*' in self) || size(self) == 1",message="allowedNamespaces: '*' admits every namespace and stands alone; list either '*' or the namespaces"
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +listType=set
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`

	// Agent configures the agent DaemonSet.
	// +optional
	Agent AgentSpec `json:"agent,omitempty"`

	// FabricDomainOverride pins the scale-up domain key of every GPU in this pool, for hardware that does not
	// report one (written ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId>).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^(ualink:[0-9a-fA-F-]+/[0-9]+|nvlink:[0-9a-fA-F-]+\.[0-9]+)$`
	FabricDomainOverride string `json:"fabricDomainOverride,omitempty"`
}

// PoolMemory is what the agent may allocate, register and stage on each node. Every quantity is a whole
// number of bytes within bounds (the operator passes it to the agent as a 64-bit byte count).
type PoolMemory struct {
	// PerGPU is the GPU memory the agent allocates on every GPU at start and lends to pods: 0 (none) or 2Mi to 1Ti.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('0')) == 0 || quantity(string(self)).compareTo(quantity('2Mi')) >= 0 && quantity(string(self)).compareTo(quantity('1Ti')) <= 0",message="memory.perGPU must be 0 or between 2Mi and 1Ti"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('0')) < 0 || quantity(string(self)).compareTo(quantity('1Ti')) > 0 || quantity(string(self)).sub(int(quantity(string(self)).asApproximateFloat())).compareTo(quantity('0')) == 0",message="memory.perGPU must be a whole number of bytes"
	PerGPU *resource.Quantity `json:"perGPU,omitempty"`
	// HostStaging bounds host memory used to stage GPU bytes for engines that need host memory: 1Mi to 1Ti.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('1Ti')) <= 0",message="memory.hostStaging must be between 1Mi and 1Ti"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('0')) < 0 || quantity(string(self)).compareTo(quantity('1Ti')) > 0 || quantity(string(self)).sub(int(quantity(string(self)).asApproximateFloat())).compareTo(quantity('0')) == 0",message="memory.hostStaging must be a whole number of bytes"
	HostStaging *resource.Quantity `json:"hostStaging,omitempty"`
	// MaxRegisteredPerCaller bounds the bytes one caller may register: 1Mi to 16Ti (unset: the agent's 1Ti).
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('16Ti')) <= 0",message="memory.maxRegisteredPerCaller must be between 1Mi and 16Ti"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('0')) < 0 || quantity(string(self)).compareTo(quantity('16Ti')) > 0 || quantity(string(self)).sub(int(quantity(string(self)).asApproximateFloat())).compareTo(quantity('0')) == 0",message="memory.maxRegisteredPerCaller must be a whole number of bytes"
	MaxRegisteredPerCaller *resource.Quantity `json:"maxRegisteredPerCaller,omitempty"`
}

// AgentSpec configures the agent pods.
type AgentSpec struct {
	// Image of the agent; empty uses the operator's --agent-image. Any other image must be on the operator's
	// --agent-image-allowlist (set by the cluster admin at install), or the pool is refused with ImageNotAllowed.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]{1,5})?/)?[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([.]|_|__|-+)[a-z0-9]+)*)*(:[A-Za-z0-9_][-A-Za-z0-9_.]{0,127})?(@sha256:[0-9a-f]{64})?$')",message="agent.image must be an image reference: [registry[:port]/]repository[:tag][@sha256:digest]"
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the agent container.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Resources of the agent container; defaults are 100m CPU and 128Mi memory requested. Only cpu, memory and
	// ephemeral-storage may be named; memory is a whole number of bytes between 64Mi and 2Ti.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || self.claims.size() == 0",message="agent.resources.claims is not supported: the agent's devices come from the host"
	// +kubebuilder:validation:XValidation:rule="(!has(self.limits) || self.limits.size() == ('cpu' in self.limits ? 1 : 0) + ('memory' in self.limits ? 1 : 0) + ('ephemeral-storage' in self.limits ? 1 : 0)) && (!has(self.requests) || self.requests.size() == ('cpu' in self.requests ? 1 : 0) + ('memory' in self.requests ? 1 : 0) + ('ephemeral-storage' in self.requests ? 1 : 0))",message="agent.resources may name only cpu, memory and ephemeral-storage"
	// +kubebuilder:validation:XValidation:rule="(!has(self.limits) || !('memory' in self.limits) || quantity(string(self.limits['memory'])).compareTo(quantity('64Mi')) >= 0 && quantity(string(self.limits['memory'])).compareTo(quantity('2Ti')) <= 0 && quantity(string(self.limits['memory'])).sub(int(quantity(string(self.limits['memory'])).asApproximateFloat())).compareTo(quantity('0')) == 0) && (!has(self.requests) || !('memory' in self.requests) || quantity(string(self.requests['memory'])).compareTo(quantity('64Mi')) >= 0 && quantity(string(self.requests['memory'])).compareTo(quantity('2Ti')) <= 0 && quantity(string(self.requests['memory'])).sub(int(quantity(string(self.requests['memory'])).asApproximateFloat())).compareTo(quantity('0')) == 0)",message="agent.resources memory must be a whole number of bytes between 64Mi and 2Ti"
	// +kubebuilder:validation:XValidation:rule="(!has(self.limits) || !('cpu' in self.limits) || quantity(string(self.limits['cpu'])).compareTo(quantity('10m')) >= 0 && quantity(string(self.limits['cpu'])).compareTo(quantity('256')) <= 0) && (!has(self.requests) || !('cpu' in self.requests) || quantity(string(self.requests['cpu'])).compareTo(quantity('10m')) >= 0 && quantity(string(self.requests['cpu'])).compareTo(quantity('256')) <= 0)",message="agent.resources cpu must be between 10m and 256"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !has(self.requests) || ['cpu', 'memory', 'ephemeral-storage'].all(k, !(k in self.limits) || !(k in self.requests) || quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",message="agent.resources requests must not exceed limits"
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// HeartbeatSeconds is how often agents renew their heartbeat Lease (and re-detect the node); a node whose
	// heartbeat is older than three periods counts as not ready.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	HeartbeatSeconds int32 `json:"heartbeatSeconds,omitempty"`
	// Port for agent-to-agent traffic (host network); the tcp data path uses Port+1 and health checks Port+2,
	// so Port is at most 65533.
	// +optional
	// +kubebuilder:default=7470
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65533
	Port int32 `json:"port,omitempty"`
	// PollMicroseconds is how long an agent keeps polling a caller's fast connection for its next request before
	// it sleeps; unset, 2000 (2 ms). Each polling connection keeps a core of the node busy meanwhile (at most two
	// at once on nodes of 16 cores or more, one below). A caller that comes back after the agent slept pays for
	// waking it, and for what its own work between calls evicted from the agent's caches: a 15,360-block call
	// from a caller busy between its calls took 494 µs with 2 ms and 301 µs with 50 ms on an H100. A caller that
	// calls every few milliseconds (an inference step) is served warm when this covers its gap, at the price of
	// that core for as long as it calls. 0 never polls.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	PollMicroseconds *int32 `json:"pollMicroseconds,omitempty"`
	// PriorityClassName of agent pods; node agents usually run as system-node-critical.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// EngineCount is how many ready nodes of a pool run one engine.
type EngineCount struct {
	Name EngineName `json:"name"`
	// Nodes counts the ready nodes whose agent runs the engine.
	// +kubebuilder:validation:Minimum=0
	Nodes int32 `json:"nodes"`
	// Available counts the ready nodes where detection found the engine possible, run or not: Available above
	// Nodes names nodes whose agents lack a runtime the hardware would allow (their TransferNodes say which).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Available int32 `json:"available"`
}

// TransferPoolStatus is what the operator observed of a pool.
type TransferPoolStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions Ready, Progressing and Degraded (the pool controller's), AgentsReady (the agents
	// controller's) and CertificatesReady (the certificate controller's).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// DesiredNodes is how many Node objects the pool selects.
	// +optional
	DesiredNodes int32 `json:"desiredNodes"`
	// ReadyNodes is how many selected nodes have an agent whose heartbeat is recent.
	// +optional
	ReadyNodes int32 `json:"readyNodes"`
	// Nodes is "ready/desired", for kubectl.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Nodes string `json:"nodes,omitempty"`
	// Engines counts, per engine, the ready nodes whose agent runs it (the TransferNode's engines[].running;
	// available, for agents that do not say), among the engines the pool allows.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=4
	Engines []EngineCount `json:"engines,omitempty"`
	// EngineSummary is Engines as one line, for kubectl (e.g. "xgmi=2 fabric=2 rdma=1 tcp=3").
	// +optional
	// +kubebuilder:validation:MaxLength=128
	EngineSummary string `json:"engineSummary,omitempty"`
	// VPods names up to 64 of the VPodTopology objects the pool's ready nodes belong to (the first by name),
	// for a first look; VPodCount counts them all. A cluster of thousands of nodes spans thousands of domains,
	// which a list in the pool's status would make a large object rewritten on every change.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=253
	VPods []string `json:"vpods,omitempty"`
	// VPodCount is how many VPodTopology objects the pool's ready nodes belong to.
	// +optional
	// +kubebuilder:validation:Minimum=0
	VPodCount int32 `json:"vpodCount,omitempty"`
	// NotReadyNodes names up to 32 selected nodes that are not ready, for a first look.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	NotReadyNodes []string `json:"notReadyNodes,omitempty"`
	// ConflictingPools are the pools (namespace/name) that came before this one and select some of its nodes:
	// they keep those nodes, and this pool runs no agent. The pool that came first lists none.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=317
	ConflictingPools []string `json:"conflictingPools,omitempty"`
}

// TransferPool runs one transfer agent on each selected node and says what the agents may do.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tp;tpool,categories=fabricxfer
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes`,description="ready/desired"
// +kubebuilder:printcolumn:name="Engines",type=string,JSONPath=`.status.engineSummary`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="a TransferPool's name must be a DNS label (at most 63 lowercase letters, digits and '-'): it is a label value, a socket directory and part of the agents' certificate name"
type TransferPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TransferPoolSpec   `json:"spec,omitempty"`
	Status TransferPoolStatus `json:"status,omitempty"`
}

// TransferPoolList is a list of TransferPools.
// +kubebuilder:object:root=true
type TransferPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TransferPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TransferPool{}, &TransferPoolList{})
}
