// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultSocketDir is the host directory under which each pool's agent socket lives, as <dir>/<pool>/agent.sock.
const DefaultSocketDir = "/var/run/fabricxfer"

// TransferPoolSpec says which nodes run a transfer agent and what those agents may do.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.socketDir) || (has(self.socketDir) && self.socketDir == oldSelf.socketDir)",message="socketDir is immutable: pods that mounted the old directory would lose their agent"
type TransferPoolSpec struct {
	// NodeSelector picks the nodes that run an agent of this pool. Empty selects every node.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations let agents run on tainted GPU nodes.
	// +optional
	// +kubebuilder:validation:MaxItems=32
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

	// SocketDir is the host directory that holds <socketDir>/<pool>/agent.sock. Pods mount the directory.
	// +optional
	// +kubebuilder:default="/var/run/fabricxfer"
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^/[A-Za-z0-9._/-]*$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="socketDir must not contain '..'"
	SocketDir string `json:"socketDir,omitempty"`

	// AllowedNamespaces may use this pool through the socket. Empty admits only the pool's own namespace;
	// "*" admits every namespace.
	// +optional
	// +kubebuilder:validation:MaxItems=64
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

// PoolMemory is what the agent may allocate, register and stage on each node.
// +kubebuilder:validation:XValidation:rule="!has(self.perGPU) || quantity(string(self.perGPU)).compareTo(quantity('0')) >= 0",message="memory.perGPU must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.hostStaging) || quantity(string(self.hostStaging)).compareTo(quantity('0')) > 0",message="memory.hostStaging must be positive"
type PoolMemory struct {
	// PerGPU is the GPU memory the agent allocates on every GPU at start and lends to pods (0: none).
	// +optional
	PerGPU *resource.Quantity `json:"perGPU,omitempty"`
	// HostStaging bounds host memory used to stage GPU bytes for engines that need host memory.
	// +optional
	HostStaging *resource.Quantity `json:"hostStaging,omitempty"`
	// MaxRegisteredPerCaller bounds the bytes one caller may register.
	// +optional
	MaxRegisteredPerCaller *resource.Quantity `json:"maxRegisteredPerCaller,omitempty"`
}

// AgentSpec configures the agent pods.
type AgentSpec struct {
	// Image of the agent; empty uses the operator's --agent-image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the agent container.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Resources of the agent container; defaults are 100m CPU and 128Mi memory requested.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// HeartbeatSeconds is how often agents renew their heartbeat Lease (and re-detect the node); a node whose
	// heartbeat is older than three periods counts as not ready.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	HeartbeatSeconds int32 `json:"heartbeatSeconds,omitempty"`
	// Port for agent-to-agent traffic (host network); the tcp data path uses Port+1 and health checks Port+2.
	// +optional
	// +kubebuilder:default=7470
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// PriorityClassName of agent pods; node agents usually run as system-node-critical.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// EngineCount is how many ready nodes of a pool can use one engine.
type EngineCount struct {
	Name EngineName `json:"name"`
	// +kubebuilder:validation:Minimum=0
	Nodes int32 `json:"nodes"`
}

// TransferPoolStatus is what the operator observed of a pool.
type TransferPoolStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions Ready, Progressing and Degraded.
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
	// Engines counts, per engine, the ready nodes where it is available.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=4
	Engines []EngineCount `json:"engines,omitempty"`
	// EngineSummary is Engines as one line, for kubectl (e.g. "xgmi=2 fabric=2 rdma=1 tcp=3").
	// +optional
	// +kubebuilder:validation:MaxLength=128
	EngineSummary string `json:"engineSummary,omitempty"`
	// VPods are the VPodTopology objects the pool's ready nodes belong to.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=253
	VPods []string `json:"vpods,omitempty"`
	// NotReadyNodes names up to 32 selected nodes that are not ready, for a first look.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	NotReadyNodes []string `json:"notReadyNodes,omitempty"`
	// ConflictingPools are other pools (namespace/name) that select some of the same nodes.
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
