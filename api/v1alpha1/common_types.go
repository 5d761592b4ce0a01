// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

// EngineName names one transfer engine. The composite engine tries them in this order for every
// (source, destination) pair: xgmi, fabric, rdma, tcp.
// +kubebuilder:validation:Enum=xgmi;fabric;rdma;tcp
type EngineName string

const (
	EngineXGMI   EngineName = "xgmi"
	EngineFabric EngineName = "fabric"
	EngineRDMA   EngineName = "rdma"
	EngineTCP    EngineName = "tcp"
)

// AllEngines lists every engine in the composite's order.
var AllEngines = []EngineName{EngineXGMI, EngineFabric, EngineRDMA, EngineTCP}

// FabricKind names a scale-up fabric whose domains span nodes.
// +kubebuilder:validation:Enum=ualink;nvlink
type FabricKind string

const (
	FabricUALink FabricKind = "ualink"
	FabricNVLink FabricKind = "nvlink"
)

// Condition types and reasons shared by the kinds of this package.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"

	ReasonAllNodesReady   = "AllNodesReady"
	ReasonNodesNotReady   = "NodesNotReady"
	ReasonNoMatchingNodes = "NoMatchingNodes"
	ReasonConflict        = "Conflict"
	ReasonReconcileError  = "ReconcileError"
	// ReasonInvalidSpec and ReasonImageNotAllowed: the operator refused the pool's spec and wrote nothing for it.
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonImageNotAllowed   = "ImageNotAllowed"
	ReasonAgentsRolledOut   = "AgentsRolledOut"
	ReasonWaitingForReports = "WaitingForReports"
	ReasonAsExpected        = "AsExpected"
	ReasonMembersMissing    = "MembersMissing"
	ReasonMembersComplete   = "MembersComplete"
	ReasonNoMembers         = "NoMembers"
	// ReasonDuplicateDomain: another VPodTopology already describes this domain.
	ReasonDuplicateDomain = "DuplicateDomain"
	// ConditionDeclared says whether the agents of a declared VPodTopology's members took every declared GPU
	// into the domain; reason DeclarationConflict names the members that refused some, and why.
	ConditionDeclared         = "Declared"
	ReasonDeclarationTaken    = "DeclarationTaken"
	ReasonDeclarationConflict = "DeclarationConflict"
	ReasonDeclarationPending  = "DeclarationPending"
	// ConditionCertificatesReady says whether a pool's agent-to-agent CA and trust bundle are issued and
	// current (written by the operator's certificate controller, beside the pool controller's three).
	ConditionCertificatesReady = "CertificatesReady"
	ReasonCertificatesIssued   = "CertificatesIssued"
	ReasonCertificatesFailed   = "IssueFailed"
	// ReasonWaitingForAgents: certificates are issued once the pool runs agents (not for a refused or
	// conflicting pool).
	ReasonWaitingForAgents = "WaitingForAgents"
	// ConditionAgentsReady says whether the operator runs the pool's agents as its spec asks: their DaemonSet,
	// ServiceAccount and RBAC applied for the pool's generation (written by the operator's agents controller).
	// True: AgentsRolledOut once the DaemonSet's rollout is complete, AgentsRollingOut before. False:
	// InvalidSpec or ImageNotAllowed (refused, nothing written), Conflict (another pool came first: no agents),
	// ReconcileError (the API server refused an object).
	ConditionAgentsReady   = "AgentsReady"
	ReasonAgentsRollingOut = "AgentsRollingOut"
)

// Labels and annotations the operator and agents set.
const (
	// LabelPoolName and LabelPoolNamespace mark objects that belong to one TransferPool.
	LabelPoolName      = "fabricxfer.io/pool"
	LabelPoolNamespace = "fabricxfer.io/pool-namespace"
	// LabelDiscovered marks a VPodTopology the operator created from reports; one without it was declared by
	// an admin and is never deleted by the operator.
	LabelDiscovered = "fabricxfer.io/discovered"
	// LabelFabricKind carries a VPodTopology's fabric kind for cheap selection.
	LabelFabricKind = "fabricxfer.io/fabric-kind"
	// MemberLabelPrefix starts the label the operator sets on a declared VPodTopology for each member node
	// (MemberLabel), so each agent watches only the declarations that name its node.
	MemberLabelPrefix = "member.fabricxfer.io/"
)
