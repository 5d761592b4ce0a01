// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

const kfdNodesDir = "/sys/class/kfd/kfd/topology/nodes"

// KFD io_link fields (kfd_crat.h).
const (
	kfdLinkTypeXGMI      = 11
	kfdLinkEnabled       = 1 << 0
	kfdLinkNoPeerToPeer  = 1 << 4
	maxKFDNodes          = 1024
	maxLinksPerKFDNodeID = 1024
)

type kfdLink struct {
	from, to uint64
	typ      uint64
	flags    uint64
}

// detectAMD reads the KFD topology: one GPU per GPU node (partitions are nodes too), and the XGMI links
// between them. It returns the GPUs found and node-level facts it could not read.
func detectAMD(ctx context.Context, h Host) ([]GPU, []Unreadable) {
	names, err := h.ReadDir(kfdNodesDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // no amdkfd: no AMD GPUs on this node
		}
		return nil, []Unreadable{{Field: "kfdTopology", Reason: whyUnreadable(kfdNodesDir, err)}}
	}
	nodeIDs := numericNames(names, maxKFDNodes)
	var gpus []GPU
	var unreadable []Unreadable
	var links []kfdLink
	linksUnreadable := map[uint64]string{}
	for _, id := range nodeIDs {
		if ctx.Err() != nil {
			return gpus, append(unreadable, Unreadable{Field: "kfdTopology", Reason: ctx.Err().Error()})
		}
		dir := fmt.Sprintf("%s/%d", kfdNodesDir, id)
		gpuID, raw, err := readKFDNode(h, dir)
		if err != nil {
			// CPU nodes are always readable; a GPU node the agent's device cgroup does not grant reads
			// EPERM. Either way the node is not counted, and the report says so.
			unreadable = append(unreadable, Unreadable{
				Field:  fmt.Sprintf("kfdNode%d", id),
				Reason: whyUnreadable(err.path, err.err) + "; a GPU there is not counted",
			})
			continue
		}
		if gpuID == 0 {
			continue // a CPU (NUMA) node
		}
		props := parseKeyValues(raw)
		if !kfdIsGPU(gpuID, props) {
			continue
		}
		gpus = append(gpus, amdGPU(h, id, props))
		for _, kind := range []string{"io_links", "p2p_links"} {
			l, why := readKFDLinks(h, dir+"/"+kind)
			links = append(links, l...)
			if why != "" {
				linksUnreadable[id] = why
			}
		}
	}
	setXGMIPeers(gpus, links, linksUnreadable)
	markPartitions(gpus)
	return gpus, unreadable
}

// markPartitions numbers the partitions of each physical GPU (KFD nodes sharing a unique_id), in KFD order.
func markPartitions(gpus []GPU) {
	byUnique := map[string][]int{}
	for i, g := range gpus {
		if g.UUID != "" {
			byUnique[g.UUID] = append(byUnique[g.UUID], i)
		}
	}
	for _, idx := range byUnique {
		if len(idx) < 2 {
			continue
		}
		for p, i := range idx {
			gpus[i].Partition, gpus[i].Partitions = p, len(idx)
		}
	}
}

type pathError struct {
	path string
	err  error
}

// readKFDNode reads a node's gpu_id (0 for CPU nodes) and, for GPU nodes, its properties.
func readKFDNode(h Host, dir string) (uint64, []byte, *pathError) {
	s, err := readTrimmed(h, dir+"/gpu_id")
	if err != nil {
		return 0, nil, &pathError{dir + "/gpu_id", err}
	}
	gpuID, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, nil, &pathError{dir + "/gpu_id", fmt.Errorf("%q is not a number", clip(s))}
	}
	if gpuID == 0 {
		return 0, nil, nil
	}
	raw, err := h.ReadFile(dir + "/properties")
	if err != nil {
		return 0, nil, &pathError{dir + "/properties", err}
	}
	return gpuID, raw, nil
}

func amdGPU(h Host, nodeID uint64, p map[string]uint64) GPU {
	g := GPU{Vendor: VendorAMD, NUMANode: -1, kfdNode: int(nodeID)}
	if v, ok := p["gfx_target_version"]; ok && v > 0 {
		g.Model = fmt.Sprintf("gfx%d%x%x", v/10000, (v/100)%100, v%100)
	}
	if v := p["unique_id"]; v != 0 {
		g.UUID = strconv.FormatUint(v, 10)
	}
	loc, hasLoc := p["location_id"]
	if !hasLoc {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "pciBusID", Reason: fmt.Sprintf("KFD node %d has no location_id", nodeID)})
	} else if bdf, err := bdfFromLocation(p["domain"], loc); err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "pciBusID", Reason: err.Error()})
	} else {
		g.PCIBusID = bdf
	}
	switch mem, ok := p["local_mem_size"]; {
	case !ok:
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "memoryBytes", Reason: "KFD properties have no local_mem_size"})
	case mem == 0:
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "memoryBytes", Reason: "KFD local_mem_size reads 0"})
	case mem > 1<<62:
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "memoryBytes", Reason: "KFD local_mem_size out of range"})
	default:
		g.MemoryBytes = int64(mem)
	}
	if g.PCIBusID != "" {
		readPCINUMA(h, &g.NUMANode, &g.Unreadable, g.PCIBusID)
		readUALink(h, &g)
		// amdgpu creates xgmi_hive_info only for a GPU that joined a hive; absence is not an error.
		if s, err := readTrimmed(h, "/sys/bus/pci/devices/"+g.PCIBusID+"/xgmi_hive_info/xgmi_hive_id"); err == nil {
			if _, perr := strconv.ParseUint(s, 10, 64); perr == nil {
				g.XGMIHive = s
			}
		}
	}
	return g
}

// readPCINUMA fills a device's NUMA node from sysfs, recording why when it cannot.
func readPCINUMA(h Host, numa *int, unreadable *[]Unreadable, bdf string) {
	p := "/sys/bus/pci/devices/" + bdf + "/numa_node"
	s, err := readTrimmed(h, p)
	if err != nil {
		*unreadable = append(*unreadable, Unreadable{Field: "numaNode", Reason: whyUnreadable(p, err)})
		return
	}
	v, err := parseNUMANode(s)
	if err != nil {
		*unreadable = append(*unreadable, Unreadable{Field: "numaNode", Reason: err.Error()})
		return
	}
	*numa = v
}

func readKFDLinks(h Host, dir string) ([]kfdLink, string) {
	names, err := h.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "" // older kernels have no p2p_links
		}
		return nil, whyUnreadable(dir, err)
	}
	var out []kfdLink
	var why []string
	for _, id := range numericNames(names, maxLinksPerKFDNodeID) {
		p := fmt.Sprintf("%s/%d/properties", dir, id)
		raw, err := h.ReadFile(p)
		if err != nil {
			why = append(why, whyUnreadable(p, err))
			continue
		}
		kv := parseKeyValues(raw)
		from, okFrom := kv["node_from"]
		to, okTo := kv["node_to"]
		typ, okType := kv["type"]
		if !okFrom || !okTo || !okType {
			why = append(why, p+": lacks node_from, node_to or type")
			continue
		}
		out = append(out, kfdLink{from: from, to: to, typ: typ, flags: kv["flags"]})
	}
	return out, strings.Join(why, "; ")
}

// setXGMIPeers marks two GPUs as XGMI peers when an enabled type-11 link joins them and no type-11 link
// between them is flagged NO_PEER_TO_PEER_DMA (ROCr drops such links; peers must be symmetric for the
// engine, so a flag in either direction removes the pair).
func setXGMIPeers(gpus []GPU, links []kfdLink, linksUnreadable map[uint64]string) {
	byNode := map[uint64]int{}
	for i, g := range gpus {
		byNode[uint64(g.kfdNode)] = i
	}
	type pair struct{ a, b int }
	enabled := map[pair]bool{}
	blocked := map[pair]bool{}
	for _, l := range links {
		if l.typ != kfdLinkTypeXGMI {
			continue
		}
		a, okA := byNode[l.from]
		b, okB := byNode[l.to]
		if !okA || !okB || a == b {
			continue
		}
		if a > b {
			a, b = b, a
		}
		p := pair{a, b}
		if l.flags&kfdLinkNoPeerToPeer != 0 {
			blocked[p] = true
		} else if l.flags&kfdLinkEnabled != 0 {
			enabled[p] = true
		}
	}
	for p := range enabled {
		if blocked[p] {
			continue
		}
		gpus[p.a].XGMIPeers = append(gpus[p.a].XGMIPeers, p.b)
		gpus[p.b].XGMIPeers = append(gpus[p.b].XGMIPeers, p.a)
	}
	for i := range gpus {
		sort.Ints(gpus[i].XGMIPeers)
		if why, ok := linksUnreadable[uint64(gpus[i].kfdNode)]; ok {
			gpus[i].Unreadable = append(gpus[i].Unreadable, Unreadable{Field: "xgmiPeers", Reason: why})
		}
	}
}

// readUALink reads the GPU's UALink vPOD membership from the PCI device's ualink/ directory.
func readUALink(h Host, g *GPU) {
	dir := "/sys/bus/pci/devices/" + g.PCIBusID + "/ualink"
	linkType, err := readTrimmed(h, dir+"/link_type")
	if errors.Is(err, fs.ErrNotExist) {
		if _, derr := h.ReadDir(dir); errors.Is(derr, fs.ErrNotExist) {
			g.FabricNote = "no UALink"
			return
		}
	}
	if err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: whyUnreadable(dir+"/link_type", err)})
		return
	}
	if !ualinkLinkTypes[strings.ToLower(linkType)] {
		g.FabricNote = fmt.Sprintf("UALink link_type %q is not a known UALink kind", clip(linkType))
		return
	}
	state, err := readTrimmed(h, dir+"/accel_state")
	if err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: whyUnreadable(dir+"/accel_state", err)})
		return
	}
	if !ualinkUsableStates[strings.ToLower(state)] {
		g.FabricNote = fmt.Sprintf("UALink accel_state %q is not usable (want ready or active)", clip(state))
		return
	}
	ppod, err := readTrimmed(h, dir+"/ppod_id")
	if err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: whyUnreadable(dir+"/ppod_id", err)})
		return
	}
	vpod, err := readTrimmed(h, dir+"/vpod_id")
	if err != nil {
		g.Unreadable = append(g.Unreadable, Unreadable{Field: "fabric", Reason: whyUnreadable(dir+"/vpod_id", err)})
		return
	}
	key, err := ualinkKey(ppod, vpod)
	if err != nil {
		g.FabricNote = "UALink " + err.Error()
		return
	}
	g.Fabric = &Fabric{Kind: FabricUALink, Domain: key}
	g.FabricNote = fmt.Sprintf("UALink %s, accel_state %s", linkType, strings.ToLower(state))
	// vpod_size only tells the operator when the domain is complete; firmware without it leaves the size unknown.
	if raw, err := readTrimmed(h, dir+"/vpod_size"); err == nil {
		if size, err := ualinkSize(raw); err != nil {
			g.FabricNote += "; " + err.Error()
		} else {
			g.Fabric.Size = size
		}
	}
}

// numericNames keeps the names that are small decimal numbers, sorted numerically.
func numericNames(names []string, limit uint64) []uint64 {
	var ids []uint64
	for _, n := range names {
		v, err := strconv.ParseUint(n, 10, 32)
		if err != nil || v >= limit || strconv.FormatUint(v, 10) != n {
			continue
		}
		ids = append(ids, v)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}
