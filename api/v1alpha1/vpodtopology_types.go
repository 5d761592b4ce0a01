// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VPodMember is one node's GPUs in a scale-up domain.
type VPodMember struct {
	// Node is a Node's name (a DNS subdomain).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Node string `json:"node"`
	// GPUs are GPU indexes on that node; empty in a declaration means "all of the node's GPUs in the domain".
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=0
	// +kubebuilder:validation:items:Maximum=1023
	// +listType=set
	GPUs []int32 `json:"gpus,omitempty"`
}

// VPodTopologySpec names one scale-up domain. Discovered domains carry only kind and domain; an admin who
// declares a domain lists the members it must have.
type VPodTopologySpec struct {
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="kind is immutable"
	Kind FabricKind `json:"kind"`
	// Domain is the domain key: ualink:<ppod_id>/<vpod_id> or nvlink:<clusterUUID>.<cliqueId>.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^(ualink:[0-9a-fA-F-]+/[0-9]+|nvlink:[0-9a-fA-F-]+\.[0-9]+)$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="domain is immutable"
	Domain string `json:"domain"`
	// Members declared by an admin, for hardware that does not report them or to catch missing ones.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +listType=map
	// +listMapKey=node
	Members []VPodMember `json:"members,omitempty"`
}

// VPodTopologyStatus is the domain as the agents report it.
type VPodTopologyStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Members are the nodes and GPUs whose agents report this domain.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +listType=map
	// +listMapKey=node
	Members []VPodMember `json:"members,omitempty"`
	// Nodes and GPUs count the reported members.
	// +optional
	Nodes int32 `json:"nodes"`
	// +optional
	GPUs int32 `json:"gpus"`
	// MissingMembers are declared nodes that do not report this domain.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=253
	MissingMembers []string `json:"missingMembers,omitempty"`
	// UndeclaredMembers are reporting nodes that a declaration does not list.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=253
	UndeclaredMembers []string `json:"undeclaredMembers,omitempty"`
}

// VPodTopology is one scale-up domain (AMD UALink vPOD, NVIDIA multi-node NVLink clique) and the GPUs across
// nodes that share it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=vpod;vpods,categories=fabricxfer
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.kind`
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpus`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.spec.domain.startsWith(self.spec.kind + ':')",message="spec.domain must start with spec.kind followed by ':'"
type VPodTopology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VPodTopologySpec   `json:"spec,omitempty"`
	Status VPodTopologyStatus `json:"status,omitempty"`
}

// VPodTopologyList is a list of VPodTopologies.
// +kubebuilder:object:root=true
type VPodTopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VPodTopology `json:"items"`
}

func init() {
	SchemeBuilder.Register(&VPodTopology{}, &VPodTopologyList{})
}
