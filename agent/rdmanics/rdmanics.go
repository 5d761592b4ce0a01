// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdmanics

import (
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/topology"
)

// FromReport is what the rdma engine needs of a detection report. A nil report has no usable port, and says so.
func FromReport(rep *topology.Report) rdma.NICs {
	if rep == nil {
		return rdma.NICs{Unavailable: "no topology report"}
	}
	var nics rdma.NICs
	for _, n := range rep.NICs {
		nics.Ports = append(nics.Ports, rdma.Port{PortName: rdma.PortName{Device: n.Name, Port: n.Port}, Usable: n.Usable()})
	}
	for _, g := range rep.GPUs {
		ranked := rdma.GPUPorts{Index: g.Index, PCIBusID: g.PCIBusID}
		for _, r := range g.NICs {
			ranked.Nearest = append(ranked.Nearest, rdma.PortName{Device: r.NIC, Port: r.Port})
		}
		nics.GPUs = append(nics.GPUs, ranked)
	}
	if e, ok := rep.Engine(engines.EngineRDMA); ok && !e.Available {
		nics.Unavailable = e.Reason
	}
	return nics
}
