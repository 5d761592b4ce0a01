// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"fmt"
	"strings"

	"github.com/fabricxfer/fabricxfer/engines"
)

// NICs are this node's RDMA facts the engine needs, as the agent's detection found them: every port and
// whether the engine may use it, and per GPU the ports in order of PCIe distance. The engine reads no sysfs
// and imports no detector: it runs on whatever its caller knows (a detection report, a test's made-up node).
type NICs struct {
	// Ports are every RDMA port detection saw, in detection order; host memory is registered on the first
	// usable one.
	Ports []Port
	// GPUs rank ports per GPU, nearest first; GPU memory is registered on the first usable port its GPU ranks.
	GPUs []GPUPorts
	// Unavailable is detection's reason the engine cannot run on this node ("" when it gave none); it wins
	// over what the ports say.
	Unavailable string
}

// PortName names one port of one RDMA device.
type PortName struct {
	Device string // "mlx5_0"
	Port   int    // from 1
}

func (p PortName) String() string { return fmt.Sprintf("%s port %d", p.Device, p.Port) }

// Port is one RDMA port and whether the engine may use it: active, and InfiniBand or Ethernet with a RoCE v2
// GID, as detection judged.
type Port struct {
	PortName
	Usable bool
}

// GPUPorts ranks ports for one GPU, found by PCI address (or by index where the memory names none).
type GPUPorts struct {
	Index    int
	PCIBusID string
	// Nearest are the GPU's ports by PCIe distance, nearest first.
	Nearest []PortName
}

// validate refuses facts the engine cannot open a device from.
func (n *NICs) validate() error {
	for _, p := range n.Ports {
		if p.Device == "" || p.Port < 1 {
			return fmt.Errorf("rdma engine: %w: NIC port %q/%d (a device name and a port from 1 are required)", engines.ErrInvalid, p.Device, p.Port)
		}
	}
	return nil
}

// chooseNIC picks the usable RDMA port nearest the memory: for GPU memory the first usable port in the GPU's
// PCIe ranking, for host memory the first usable port.
func chooseNIC(nics *NICs, loc engines.Location) (PortName, error) {
	usable := map[PortName]bool{}
	var any []PortName
	for _, p := range nics.Ports {
		if p.Usable {
			usable[p.PortName] = true
			any = append(any, p.PortName)
		}
	}
	if len(any) == 0 {
		return PortName{}, fmt.Errorf("no usable RDMA port (%d ports seen, none active with InfiniBand or RoCE v2)", len(nics.Ports))
	}
	if loc.Kind != engines.LocationGPU {
		return any[0], nil
	}
	for _, g := range nics.GPUs {
		if (loc.BusID != "" && strings.EqualFold(g.PCIBusID, loc.BusID)) || (loc.BusID == "" && g.Index == loc.Device) {
			for _, p := range g.Nearest {
				if usable[p] {
					return p, nil
				}
			}
			return PortName{}, fmt.Errorf("GPU %d (%s) ranks no usable RDMA port", g.Index, g.PCIBusID)
		}
	}
	return PortName{}, fmt.Errorf("GPU %d (%q) is not among the GPUs whose NICs were ranked", loc.Device, loc.BusID)
}

// unavailableReason is why the engine cannot run on these facts, "" when it can.
func unavailableReason(nics *NICs) string {
	if nics.Unavailable != "" {
		return nics.Unavailable
	}
	if _, ok := usablePort(nics, ""); ok {
		return ""
	}
	return "no usable RDMA port"
}

// usablePort finds a usable port of the named device (any device when device is ""): the devices the engine
// registers memory on, so the only ones a peer may name.
func usablePort(nics *NICs, device string) (PortName, bool) {
	for _, p := range nics.Ports {
		if p.Usable && (device == "" || p.Device == device) {
			return p.PortName, true
		}
	}
	return PortName{}, false
}
