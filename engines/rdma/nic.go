// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"fmt"
	"strings"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/topology"
)

// nicChoice is the NIC port a region is registered on.
type nicChoice struct {
	name string
	port int
}

func (n nicChoice) String() string { return fmt.Sprintf("%s port %d", n.name, n.port) }

// chooseNIC picks the usable RDMA port nearest the memory: for GPU memory the
// first usable port in the GPU's PCIe ranking, for host memory the first
// usable port on the memory's NUMA node if known, else the first usable one.
func chooseNIC(rep *topology.Report, loc engines.Location) (nicChoice, error) {
	if rep == nil {
		return nicChoice{}, fmt.Errorf("no topology report")
	}
	usable := map[nicChoice]topology.NIC{}
	var any []nicChoice
	for _, n := range rep.NICs {
		if n.Usable() {
			c := nicChoice{n.Name, n.Port}
			usable[c] = n
			any = append(any, c)
		}
	}
	if len(any) == 0 {
		return nicChoice{}, fmt.Errorf("no usable RDMA port (%d ports seen, none active with InfiniBand or RoCE v2)", len(rep.NICs))
	}
	if loc.Kind != engines.LocationGPU {
		return any[0], nil
	}
	for _, g := range rep.GPUs {
		if (loc.BusID != "" && strings.EqualFold(g.PCIBusID, loc.BusID)) || (loc.BusID == "" && g.Index == loc.Device) {
			for _, r := range g.NICs {
				if _, ok := usable[nicChoice{r.NIC, r.Port}]; ok {
					return nicChoice{r.NIC, r.Port}, nil
				}
			}
			return nicChoice{}, fmt.Errorf("GPU %d (%s) ranks no usable RDMA port", g.Index, g.PCIBusID)
		}
	}
	return nicChoice{}, fmt.Errorf("GPU %d (%q) is not in the topology report", loc.Device, loc.BusID)
}

// unavailableReason is the detector's verdict on the rdma engine, if it has one.
func unavailableReason(rep *topology.Report) string {
	if rep == nil {
		return "no topology report"
	}
	for _, e := range rep.Engines {
		if e.Name == engines.EngineRDMA && !e.Available {
			return e.Reason
		}
	}
	for _, n := range rep.NICs {
		if n.Usable() {
			return ""
		}
	}
	return "no usable RDMA port"
}

// usablePort reports whether the named device has a usable port in the report (the devices the engine
// registers memory on, so the only ones a peer may name).
func usablePort(rep *topology.Report, device string) bool {
	if rep == nil {
		return false
	}
	for _, n := range rep.NICs {
		if n.Name == device && n.Usable() {
			return true
		}
	}
	return false
}
