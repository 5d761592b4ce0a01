// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"sort"
	"strings"
)

// pciPath is a device's position in the PCIe tree: its root complex and the chain of functions from the
// root port down to the device itself.
type pciPath struct {
	root  string
	chain []string
}

// parsePCIPath splits a sysfs device realpath (/sys/devices/pci0000:00/0000:00:01.1/.../0000:05:00.0) into
// root and chain. Components are compared whole, so 0000:00:01.1 and 0000:00:01.10 never share a prefix.
func parsePCIPath(p string) (pciPath, bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i, part := range parts {
		if !strings.HasPrefix(part, "pci") || len(part) < 8 {
			continue
		}
		out := pciPath{root: part}
		for _, c := range parts[i+1:] {
			if _, err := canonicalBDF(c); err != nil {
				break
			}
			out.chain = append(out.chain, strings.ToLower(c))
		}
		return out, len(out.chain) > 0
	}
	return pciPath{}, false
}

// pciDistance classifies the path between two devices the way nvidia-smi topo does, and counts the
// components below their common bridge to break ties.
func pciDistance(a, b pciPath, numaA, numaB int) (Level, int) {
	common := 0
	if a.root == b.root {
		for common < len(a.chain)-1 && common < len(b.chain)-1 && a.chain[common] == b.chain[common] {
			common++
		}
	}
	leftA, leftB := len(a.chain)-common, len(b.chain)-common
	hops := leftA + leftB
	switch {
	case a.root == b.root && common >= 2 && leftA <= 2 && leftB <= 2:
		// Both hang off downstream ports of one switch (upstream port shared): a single bridge.
		return LevelPIX, hops
	case a.root == b.root && common >= 1:
		return LevelPXB, hops
	case a.root == b.root:
		return LevelPHB, hops
	case numaA >= 0 && numaA == numaB:
		return LevelNODE, hops
	}
	return LevelSYS, hops
}

// rankNICs fills, for every GPU, its NICs nearest first and, for every NIC, the GPUs at its smallest
// distance. It returns the facts it could not establish.
func rankNICs(h Host, gpus []GPU, nics []NIC) {
	gpuPaths := make([]*pciPath, len(gpus))
	gpuWhy := make([]string, len(gpus))
	for i, g := range gpus {
		if g.PCIBusID == "" {
			gpuWhy[i] = "GPU PCI bus id unknown"
			continue
		}
		rp, err := h.Realpath(pciDevicesDir + "/" + g.PCIBusID)
		if err != nil {
			gpuWhy[i] = whyUnreadable(pciDevicesDir+"/"+g.PCIBusID, err)
			continue
		}
		p, ok := parsePCIPath(rp)
		if !ok {
			gpuWhy[i] = rp + " is not under a PCI root"
			continue
		}
		gpuPaths[i] = &p
	}
	nicPaths := make([]*pciPath, len(nics))
	for j, n := range nics {
		if p, ok := parsePCIPath(n.pciPath); ok {
			nicPaths[j] = &p
		}
	}
	type dist struct {
		level Level
		hops  int
	}
	d := make([][]*dist, len(gpus))
	for i := range gpus {
		d[i] = make([]*dist, len(nics))
		for j := range nics {
			if gpuPaths[i] == nil || nicPaths[j] == nil {
				continue
			}
			l, hops := pciDistance(*gpuPaths[i], *nicPaths[j], gpus[i].NUMANode, nics[j].NUMANode)
			d[i][j] = &dist{l, hops}
			gpus[i].NICs = append(gpus[i].NICs, NICRank{NIC: nics[j].Name, Port: nics[j].Port, Level: l, Hops: hops})
		}
		sort.SliceStable(gpus[i].NICs, func(x, y int) bool {
			a, b := gpus[i].NICs[x], gpus[i].NICs[y]
			if a.Level != b.Level {
				return a.Level < b.Level
			}
			if a.Hops != b.Hops {
				return a.Hops < b.Hops
			}
			if a.NIC != b.NIC {
				return a.NIC < b.NIC
			}
			return a.Port < b.Port
		})
		if gpuPaths[i] == nil && len(nics) > 0 {
			gpus[i].Unreadable = append(gpus[i].Unreadable, Unreadable{Field: "nics", Reason: "PCIe distance to NICs unknown: " + gpuWhy[i]})
		}
	}
	for j := range nics {
		if len(gpus) == 0 {
			continue
		}
		best := LevelSYS + 1
		var missing []int
		for i := range gpus {
			if d[i][j] == nil {
				missing = append(missing, i)
				continue
			}
			if d[i][j].level < best {
				best = d[i][j].level
			}
		}
		if nicPaths[j] == nil {
			nics[j].Unreadable = append(nics[j].Unreadable, Unreadable{Field: "nearestGPUs", Reason: "NIC PCI path unknown"})
			continue
		}
		type cand struct{ gpu, hops int }
		var at []cand
		for i := range gpus {
			if d[i][j] != nil && d[i][j].level == best {
				at = append(at, cand{i, d[i][j].hops})
			}
		}
		sort.SliceStable(at, func(x, y int) bool {
			if at[x].hops != at[y].hops {
				return at[x].hops < at[y].hops
			}
			return at[x].gpu < at[y].gpu
		})
		for _, c := range at {
			nics[j].NearestGPUs = append(nics[j].NearestGPUs, c.gpu)
		}
		if len(at) > 0 {
			nics[j].NearestLevel = best.String()
		}
		if len(missing) > 0 {
			nics[j].Unreadable = append(nics[j].Unreadable, Unreadable{Field: "nearestGPUs", Reason: "PCIe distance unknown to GPUs " + intRanges(missing)})
		}
	}
}
