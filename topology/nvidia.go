// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

const (
	pciDevicesDir     = "/sys/bus/pci/devices"
	nvidiaProcGPUs    = "/proc/driver/nvidia/gpus"
	nvidiaProcVersion = "/proc/driver/nvidia/version"
	nvidiaVendor      = 0x10de
	pciClassDisplay   = 0x03     // base class of GPUs (3D controllers are 0x0302)
	pciClassNVSwitch  = 0x068000 // PCI_NVSWITCH_CLASS
	maxPCIDevices     = 4096
)

// pciInventory is what one pass over /sys/bus/pci/devices tells: the NVIDIA GPUs and NVSwitches.
type pciInventory struct {
	nvidiaGPUs []string
	nvSwitches int
}

func scanPCI(h Host) (pciInventory, []Unreadable) {
	var inv pciInventory
	names, err := h.ReadDir(pciDevicesDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return inv, nil
		}
		return inv, []Unreadable{{Field: "pciDevices", Reason: whyUnreadable(pciDevicesDir, err)}}
	}
	if len(names) > maxPCIDevices {
		names = names[:maxPCIDevices]
	}
	for _, bdf := range names {
		vendor, err := readTrimmed(h, pciDevicesDir+"/"+bdf+"/vendor")
		if err != nil {
			continue
		}
		if v, err := parseHex(vendor); err != nil || v != nvidiaVendor {
			continue
		}
		class, err := readTrimmed(h, pciDevicesDir+"/"+bdf+"/class")
		if err != nil {
			continue
		}
		c, err := parseHex(class)
		if err != nil {
			continue
		}
		canon, err := canonicalBDF(bdf)
		if err != nil {
			continue
		}
		switch {
		case c>>16 == pciClassDisplay:
			inv.nvidiaGPUs = append(inv.nvidiaGPUs, canon)
		case c == pciClassNVSwitch:
			inv.nvSwitches++
		}
	}
	return inv, nil
}

// detectNVIDIA finds NVIDIA GPUs on the PCI bus (and in the driver's procfs), then asks NVML for what only
// NVML knows: UUID and memory, NVLink peers, and the GPU fabric clique. GPUs are ordered by PCI bus id, as
// NVML and nvidia-smi number them.
func detectNVIDIA(ctx context.Context, h Host, open OpenNVML, inv pciInventory) ([]GPU, []Unreadable) {
	bdfs := map[string]bool{}
	for _, b := range inv.nvidiaGPUs {
		bdfs[b] = true
	}
	if procNames, err := h.ReadDir(nvidiaProcGPUs); err == nil {
		for _, n := range procNames {
			if b, err := canonicalBDF(n); err == nil {
				bdfs[b] = true
			}
		}
	}
	if len(bdfs) == 0 {
		return nil, nil
	}
	var nodeUnreadable []Unreadable
	var lib NVML
	var nvmlErr error
	if open == nil {
		nvmlErr = errors.New("no NVML loader configured")
	} else {
		var release func()
		lib, release, nvmlErr = open()
		if nvmlErr == nil && release != nil {
			defer release()
		}
	}
	nvmlIndex := map[string]int{}
	if nvmlErr == nil {
		n, err := lib.DeviceCount()
		if err != nil {
			nvmlErr = fmt.Errorf("device count: %w", err)
		}
		for i := 0; i < n && i < maxPCIDevices; i++ {
			raw, err := lib.PCIBusID(i)
			if err != nil {
				nodeUnreadable = append(nodeUnreadable, Unreadable{Field: fmt.Sprintf("nvmlDevice%d", i), Reason: fmt.Sprintf("NVML PCI bus id: %v", err)})
				continue
			}
			b, err := canonicalBDF(raw)
			if err != nil {
				nodeUnreadable = append(nodeUnreadable, Unreadable{Field: fmt.Sprintf("nvmlDevice%d", i), Reason: "NVML " + err.Error()})
				continue
			}
			nvmlIndex[b] = i
			bdfs[b] = true // a GPU NVML sees is real even where sysfs is not mounted
		}
	}
	if nvmlErr != nil {
		nodeUnreadable = append(nodeUnreadable, Unreadable{Field: "nvml", Reason: "NVML unavailable: " + nvmlErr.Error()})
	}
	ordered := make([]string, 0, len(bdfs))
	for b := range bdfs {
		ordered = append(ordered, b)
	}
	sort.Strings(ordered)

	gpus := make([]GPU, 0, len(ordered))
	for _, bdf := range ordered {
		if ctx.Err() != nil {
			break
		}
		g := GPU{Vendor: VendorNVIDIA, PCIBusID: bdf, NUMANode: -1, kfdNode: -1}
		readPCINUMA(h, &g.NUMANode, &g.Unreadable, bdf)
		info := readNVIDIAProcInfo(h, bdf)
		g.Model = info["Model"]
		procUUID := info["GPU UUID"]
		idx, inNVML := nvmlIndex[bdf]
		switch {
		case nvmlErr != nil:
			g.UUID = procUUID
			why := "NVML unavailable: " + nvmlErr.Error()
			if g.UUID == "" {
				g.Unreadable = append(g.Unreadable, Unreadable{Field: "uuid", Reason: why})
			}
			g.Unreadable = append(g.Unreadable,
				Unreadable{Field: "memoryBytes", Reason: why},
				Unreadable{Field: "xgmiPeers", Reason: why},
				Unreadable{Field: "fabric", Reason: why})
			g.FabricNote = why
		case !inNVML:
			g.UUID = procUUID
			why := "NVML does not list this GPU (excluded, or not visible to the agent)"
			g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: why}, Unreadable{Field: "xgmiPeers", Reason: why})
			g.FabricNote = why
		default:
			fillFromNVML(lib, idx, procUUID, &g)
		}
		gpus = append(gpus, g)
	}
	if nvmlErr == nil {
		setNVLinkPeers(lib, gpus, nvmlIndex)
	}
	return gpus, nodeUnreadable
}

func readNVIDIAProcInfo(h Host, bdf string) map[string]string {
	raw, err := h.ReadFile(nvidiaProcGPUs + "/" + bdf + "/information")
	if err != nil {
		return map[string]string{}
	}
	return parseKeyColon(raw)
}

func fillFromNVML(lib NVML, idx int, procUUID string, g *GPU) {
	if uuid, err := lib.UUID(idx); err == nil {
		g.UUID = uuid
	} else if procUUID != "" {
		g.UUID = procUUID
	} else {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "uuid", Reason: fmt.Sprintf("NVML UUID: %v", err)})
	}
	if g.Model == "" {
		if name, err := lib.Name(idx); err == nil {
			g.Model = name
		}
	}
	if mem, err := lib.MemoryBytes(idx); err == nil && mem > 0 && mem < 1<<62 {
		g.MemoryBytes = int64(mem)
	} else {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "memoryBytes", Reason: fmt.Sprintf("NVML memory info: %v", errOr(err, "reads 0"))})
	}
	links, err := lib.NVLinks(idx)
	switch {
	case err == nil:
		for _, l := range links {
			if l.Active {
				g.ActiveNVLinks++
			}
		}
	case !errors.Is(err, ErrNotSupported):
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "nvlinks", Reason: fmt.Sprintf("NVML NVLink state: %v", err)})
	}
	fabric, note, err := nvlinkFabric(lib.FabricInfo(idx))
	if err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: fmt.Sprintf("NVML GPU fabric info: %v", err)})
		g.FabricNote = "NVML GPU fabric info unreadable"
		return
	}
	g.Fabric, g.FabricNote = fabric, note
}

// setNVLinkPeers marks GPUs as NVLink peers when NVML reports P2P over NVLink OK in both directions.
func setNVLinkPeers(lib NVML, gpus []GPU, nvmlIndex map[string]int) {
	for a := range gpus {
		ia, okA := nvmlIndex[gpus[a].PCIBusID]
		if !okA {
			continue
		}
		var failures []string
		for b := range gpus {
			ib, okB := nvmlIndex[gpus[b].PCIBusID]
			if a == b || !okB {
				continue
			}
			st, err := lib.P2PNVLink(ia, ib)
			if errors.Is(err, ErrNotSupported) {
				continue
			}
			if err != nil {
				failures = append(failures, fmt.Sprintf("GPU %d: %v", b, err))
				continue
			}
			back, err := lib.P2PNVLink(ib, ia)
			if err == nil && st == "OK" && back == "OK" {
				gpus[a].XGMIPeers = append(gpus[a].XGMIPeers, b)
			}
		}
		if len(failures) > 0 {
			gpus[a].Unreadable = append(gpus[a].Unreadable, Unreadable{Field: "xgmiPeers", Reason: "NVML P2P status: " + strings.Join(failures, "; ")})
		}
	}
}

// imexChannelDir holds the IMEX channel device nodes (made by tooling or a ComputeDomain, not the kernel).
const imexChannelDir = "/dev/nvidia-caps-imex-channels"

// readIMEX reports whether the NVIDIA driver registered its IMEX channel region (/proc/devices) and how many
// channel devices exist. Importing fabric memory from another node needs a channel device, not just the
// region.
func readIMEX(h Host) (bool, int, []Unreadable) {
	var un []Unreadable
	registered := false
	if raw, err := h.ReadFile("/proc/devices"); err != nil {
		un = append(un, Unreadable{Field: "imexChannels", Reason: whyUnreadable("/proc/devices", err)})
	} else {
		_, registered = parseCharDevices(raw)["nvidia-caps-imex-channels"]
	}
	names, err := h.ReadDir(imexChannelDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		un = append(un, Unreadable{Field: "imexChannels", Reason: whyUnreadable(imexChannelDir, err)})
	}
	channels := 0
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, "channel"); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			channels++
		}
	}
	return registered, channels, un
}

func errOr(err error, otherwise string) any {
	if err != nil {
		return err
	}
	return otherwise
}
