// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodestatus

import (
	"fmt"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// API limits of TransferNodeStatus (api/v1alpha1/transfernode_types.go).
const (
	maxGPUs            = 64
	maxNICs            = 64
	maxPeers           = 64
	maxUnreadable      = 16
	maxFieldLen        = 64
	maxReasonLen       = 256
	maxEngineReasonLen = 512
	maxShortStringLen  = 64
	maxPCIBusIDLen     = 16
	maxDomainLen       = 128
	maxEndpointLen     = 256
	maxNameLen         = 253
	maxDeclarations    = 16
	truncatedFieldName = "truncated"
	truncatedReasonFmt = "%d more %s not listed (the API keeps %d); run 'agent detect' on the node for all of them"
	unreadableOverflow = "%d more unreadable facts not listed; run 'agent detect' on the node for all of them"
)

// Identity is what the running agent adds to what it detected.
type Identity struct {
	AgentVersion string
	// Endpoint is host:port for agent-to-agent traffic; empty when the agent serves none.
	Endpoint string
}

// FromReport converts a detection report into the TransferNode status. LastHeartbeat and RegisteredBytes are
// left to the reporter.
func FromReport(r topology.Report, id Identity) v1alpha1.TransferNodeStatus {
	st := v1alpha1.TransferNodeStatus{
		AgentVersion: clip(id.AgentVersion, maxShortStringLen),
		Endpoint:     clip(id.Endpoint, maxEndpointLen),
		GPUDirect:    &v1alpha1.GPUDirect{DMABuf: r.GPUDirect.DMABuf, PeerMem: r.GPUDirect.PeerMem},
	}
	nodeUnreadable := append([]topology.Unreadable(nil), r.Unreadable...)
	gpus := r.GPUs
	if len(gpus) > maxGPUs {
		nodeUnreadable = append([]topology.Unreadable{{Field: truncatedFieldName, Reason: fmt.Sprintf(truncatedReasonFmt, len(gpus)-maxGPUs, "GPUs", maxGPUs)}}, nodeUnreadable...)
		gpus = gpus[:maxGPUs]
	}
	for _, g := range gpus {
		out := v1alpha1.GPU{
			Index:       int32(g.Index),
			Vendor:      v1alpha1.GPUVendor(g.Vendor),
			UUID:        clip(g.UUID, maxShortStringLen),
			PCIBusID:    clip(g.PCIBusID, maxPCIBusIDLen),
			NUMANode:    int32(g.NUMANode),
			MemoryBytes: g.MemoryBytes,
			XGMIPeers:   int32s(g.XGMIPeers, maxPeers),
			Unreadable:  unreadable(g.Unreadable),
		}
		if g.Fabric != nil {
			out.Fabric = &v1alpha1.FabricMembership{Kind: v1alpha1.FabricKind(g.Fabric.Kind), Domain: clip(g.Fabric.Domain, maxDomainLen),
				Source: v1alpha1.FabricSource(g.Fabric.Source), Declaration: clip(g.Fabric.Declaration, maxNameLen)}
			if g.Fabric.Size > 0 && g.Fabric.Size <= topology.MaxDomainSize {
				out.Fabric.DomainSize = int32(g.Fabric.Size)
			}
		}
		st.GPUs = append(st.GPUs, out)
	}
	nics := r.NICs
	if len(nics) > maxNICs {
		nodeUnreadable = append([]topology.Unreadable{{Field: truncatedFieldName, Reason: fmt.Sprintf(truncatedReasonFmt, len(nics)-maxNICs, "RDMA ports", maxNICs)}}, nodeUnreadable...)
		nics = nics[:maxNICs]
	}
	for _, n := range nics {
		st.NICs = append(st.NICs, v1alpha1.NIC{
			Name:        clip(n.Name, maxShortStringLen),
			Port:        int32(n.Port),
			State:       clip(n.State, 32),
			LinkLayer:   clip(n.LinkLayer, 32),
			RoCEv2:      n.RoCEv2,
			RateGbps:    int32(n.RateGbps),
			PCIBusID:    clip(n.PCIBusID, maxPCIBusIDLen),
			NUMANode:    int32(n.NUMANode),
			NearestGPUs: int32s(n.NearestGPUs, maxGPUs),
			Unreadable:  unreadable(n.Unreadable),
		})
	}
	for _, e := range r.Engines {
		st.Engines = append(st.Engines, v1alpha1.EngineAvailability{
			Name:      v1alpha1.EngineName(e.Name),
			Available: e.Available,
			Reason:    clip(e.Reason, maxEngineReasonLen),
		})
	}
	decls := r.Declarations
	if len(decls) > maxDeclarations {
		nodeUnreadable = append([]topology.Unreadable{{Field: truncatedFieldName, Reason: fmt.Sprintf(truncatedReasonFmt, len(decls)-maxDeclarations, "declarations", maxDeclarations)}}, nodeUnreadable...)
		decls = decls[:maxDeclarations]
	}
	for _, d := range decls {
		st.Declarations = append(st.Declarations, v1alpha1.FabricDeclaration{
			VPodTopology: clip(d.Name, maxNameLen),
			Domain:       clip(d.Domain, maxDomainLen),
			GPUs:         int32s(d.GPUs, maxGPUs),
			Refused:      clip(d.Refused, maxEngineReasonLen),
		})
	}
	st.Unreadable = unreadable(nodeUnreadable)
	return st
}

func unreadable(in []topology.Unreadable) []v1alpha1.Unreadable {
	var out []v1alpha1.Unreadable
	for i, u := range in {
		if i == maxUnreadable-1 && len(in) > maxUnreadable {
			out = append(out, v1alpha1.Unreadable{Field: truncatedFieldName, Reason: fmt.Sprintf(unreadableOverflow, len(in)-i)})
			break
		}
		out = append(out, v1alpha1.Unreadable{Field: clip(u.Field, maxFieldLen), Reason: clip(u.Reason, maxReasonLen)})
	}
	return out
}

func int32s(in []int, limit int) []int32 {
	if len(in) == 0 {
		return nil
	}
	if len(in) > limit {
		in = in[:limit]
	}
	out := make([]int32, len(in))
	for i, v := range in {
		out[i] = int32(v)
	}
	return out
}

// ClipReason keeps an engine's reason within what the API takes (512 bytes), at a character boundary.
func ClipReason(s string) string { return clip(s, maxEngineReasonLen) }

// clip shortens s to n bytes, marking the cut, without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && s[cut]&0xc0 == 0x80 {
		cut--
	}
	return s[:cut] + "..."
}
