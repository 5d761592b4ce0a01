// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GPUVendor names a GPU vendor.
// +kubebuilder:validation:Enum=amd;nvidia
type GPUVendor string

const (
	VendorAMD    GPUVendor = "amd"
	VendorNVIDIA GPUVendor = "nvidia"
)

// TransferNodeSpec names the node and pool a TransferNode belongs to. The agent writes it.
type TransferNodeSpec struct {
	// NodeName is the Node this report describes; it equals the object's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`
	// PoolNamespace and PoolName name the TransferPool whose agent writes this report.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	PoolNamespace string `json:"poolNamespace,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PoolName string `json:"poolName,omitempty"`
}

// FabricSource says where a GPU's fabric domain came from.
// +kubebuilder:validation:Enum=discovered;declared;override
type FabricSource string

const (
	// FabricDiscovered: the hardware reports the domain (UALink sysfs, NVML clique).
	FabricDiscovered FabricSource = "discovered"
	// FabricDeclared: a VPodTopology that names the node declares the GPU in the domain.
	FabricDeclared FabricSource = "declared"
	// FabricOverride: the pool's fabricDomainOverride (the agent's --fabric-domain) pins every GPU.
	FabricOverride FabricSource = "override"
)

// FabricMembership places a GPU in a scale-up domain that spans nodes.
type FabricMembership struct {
	Kind FabricKind `json:"kind"`
	// Domain is the domain key: ualink:<ppod_id>/<vpod_id> or nvlink:<clusterUUID>.<cliqueId>.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^(ualink:[0-9a-fA-F-]+/[0-9]+|nvlink:[0-9a-fA-F-]+\.[0-9]+)$`
	Domain string `json:"domain"`
	// Source says where the domain came from; agents older than declarations leave it empty (discovered).
	// +optional
	Source FabricSource `json:"source,omitempty"`
	// Declaration names the VPodTopology that declared the GPU in the domain (source declared).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Declaration string `json:"declaration,omitempty"`
	// DomainSize is how many GPUs the hardware says the domain holds (UALink's vpod_size); absent when it does
	// not say. The operator writes the status of a domain still short of it less often while its members
	// report, and at once when the last one does.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	DomainSize int32 `json:"domainSize,omitempty"`
}

// FabricDeclaration is one VPodTopology that declares GPUs of this node, and what the agent took of it.
type FabricDeclaration struct {
	// VPodTopology is the declaring object's name.
	// +kubebuilder:validation:MaxLength=253
	VPodTopology string `json:"vpodTopology"`
	// +kubebuilder:validation:MaxLength=128
	Domain string `json:"domain"`
	// GPUs are the declared GPU indexes the agent put in the domain (or found there already).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	GPUs []int32 `json:"gpus,omitempty"`
	// Refused says which declared GPUs are not in the domain, and why; empty when every one is.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Refused string `json:"refused,omitempty"`
}

// Unreadable records a fact the detector could not read, and why; nothing is guessed in its place.
type Unreadable struct {
	// +kubebuilder:validation:MaxLength=64
	Field string `json:"field"`
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason"`
}

// GPU is one detected GPU (or GPU partition).
type GPU struct {
	// Index is the GPU's index on its node; a VPodTopology's members hold indexes up to 1023.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Index  int32     `json:"index"`
	Vendor GPUVendor `json:"vendor"`
	// UUID (NVIDIA) or unique_id (AMD) of the GPU.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	UUID string `json:"uuid,omitempty"`
	// PCIBusID is 0000:bb:dd.f, lowercase.
	// +kubebuilder:validation:MaxLength=16
	PCIBusID string `json:"pciBusID"`
	// NUMANode is -1 where the platform reports none.
	NUMANode int32 `json:"numaNode"`
	// MemoryBytes is the GPU's memory size where known.
	// +optional
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// XGMIPeers are indexes of GPUs on this node reachable over XGMI/NVLink peer links.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	XGMIPeers []int32 `json:"xgmiPeers,omitempty"`
	// Fabric is the scale-up domain of this GPU; absent when it is in none.
	// +optional
	Fabric *FabricMembership `json:"fabric,omitempty"`
	// Unreadable lists facts of this GPU that could not be read.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Unreadable []Unreadable `json:"unreadable,omitempty"`
}

// NIC is one RDMA port.
type NIC struct {
	// Name is the RDMA device name (e.g. mlx5_0).
	// +kubebuilder:validation:MaxLength=64
	Name string `json:"name"`
	// +kubebuilder:validation:Minimum=1
	Port int32 `json:"port"`
	// State is the port state without its number (ACTIVE, DOWN, INIT, ...).
	// +kubebuilder:validation:MaxLength=32
	State string `json:"state"`
	// LinkLayer is InfiniBand or Ethernet.
	// +kubebuilder:validation:MaxLength=32
	LinkLayer string `json:"linkLayer"`
	// RoCEv2 is true when an Ethernet port has a RoCE v2 GID.
	RoCEv2 bool `json:"roceV2"`
	// RateGbps is the port rate.
	// +optional
	RateGbps int32 `json:"rateGbps,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=16
	PCIBusID string `json:"pciBusID,omitempty"`
	NUMANode int32  `json:"numaNode"`
	// NearestGPUs are the GPU indexes this NIC is closest to by PCIe distance, nearest first.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	NearestGPUs []int32 `json:"nearestGPUs,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Unreadable []Unreadable `json:"unreadable,omitempty"`
}

// EngineAvailability says whether one engine can run on this node (what detection found), whether the agent
// runs it, and why not.
// +kubebuilder:validation:XValidation:rule="!has(self.running) || !self.running || self.available || self.name == 'xgmi'",message="an engine runs only where detection finds it available (the same-node engine aside: it copies host memory on a node without GPUs)"
type EngineAvailability struct {
	Name EngineName `json:"name"`
	// Available is detection's answer: the hardware and the pool's engine list allow the engine here.
	Available bool `json:"available"`
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
	// Running says whether this node's agent moves bytes with the engine now (what its socket's GetInfo says):
	// false where the agent lacks the runtime (no CUDA driver, no libibverbs, no certificates), only reports,
	// or has not assembled its engines yet; true for the same-node engine on a node without GPUs (host memory).
	// Absent from agents older than the field, which are read as running what is available.
	// +optional
	Running *bool `json:"running,omitempty"`
	// RunningReason says why the engine does not run, or how it runs where that differs from Reason.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	RunningReason string `json:"runningReason,omitempty"`
	// GPUMemory says whether the running engine moves this node's GPU memory: the same-node engine with a GPU
	// copy backend (not the host backend alone), tcp staging GPU memory through pinned host memory, fabric.
	// Absent where the agent does not say (rdma, older agents).
	// +optional
	GPUMemory *bool `json:"gpuMemory,omitempty"`
}

// Runs says whether the node's agent runs the engine: Running where the agent says, Available for an agent
// older than the field.
func (e EngineAvailability) Runs() bool {
	if e.Running != nil {
		return *e.Running
	}
	return e.Available
}

// GPUDirect says how a NIC may reach GPU memory directly.
type GPUDirect struct {
	DMABuf  bool `json:"dmaBuf"`
	PeerMem bool `json:"peerMem"`
}

// TransferNodeStatus is what one node's agent detected and reports.
type TransferNodeStatus struct {
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(g, self.exists_one(h, h.index == g.index))",message="GPU indexes must be unique"
	// +listType=atomic
	GPUs []GPU `json:"gpus,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	NICs []NIC `json:"nics,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=4
	// +listType=map
	// +listMapKey=name
	Engines []EngineAvailability `json:"engines,omitempty"`
	// +optional
	GPUDirect *GPUDirect `json:"gpuDirect,omitempty"`
	// Endpoint is host:port for agent-to-agent traffic.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Endpoint string `json:"endpoint,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	AgentVersion string `json:"agentVersion,omitempty"`
	// LastHeartbeat is when the agent last wrote this status. Agents that run for a pool write it only when the
	// report changes and heartbeat by renewing a Lease (labelled fabricxfer.io/pool) in the pool's namespace
	// every period; the operator takes the later of the two.
	// +optional
	LastHeartbeat *metav1.Time `json:"lastHeartbeat,omitempty"`
	// RegisteredBytes is the memory currently registered with the agent.
	// +optional
	RegisteredBytes int64 `json:"registeredBytes,omitempty"`
	// Unreadable lists node-level facts that could not be read.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Unreadable []Unreadable `json:"unreadable,omitempty"`
	// Declarations are the VPodTopologies that declare GPUs of this node, beside what the hardware reports
	// (each GPU's fabric.source), with what the agent took of each.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Declarations []FabricDeclaration `json:"declarations,omitempty"`
}

// TransferNode is what one node's transfer agent detected: GPUs, peer links, fabric membership, NICs and the
// engines it can run. The agent writes it with server-side apply; it is owned by the Node and goes with it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tn;tnode,categories=fabricxfer
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolName`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Reported",type=date,JSONPath=`.status.lastHeartbeat`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.nodeName",message="metadata.name must equal spec.nodeName"
type TransferNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TransferNodeSpec   `json:"spec,omitempty"`
	Status TransferNodeStatus `json:"status,omitempty"`
}

// TransferNodeList is a list of TransferNodes.
// +kubebuilder:object:root=true
type TransferNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TransferNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TransferNode{}, &TransferNodeList{})
}
