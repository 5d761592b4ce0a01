// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Options configure one detection.
type Options struct {
	// OpenNVML loads NVML when NVIDIA GPUs are present; nil reports NVML facts as unreadable.
	OpenNVML OpenNVML
	// Overrides force engines off or pin the fabric domain.
	Overrides Overrides
	// Declarations place GPUs the hardware reports in no domain into declared ones, earliest first.
	Declarations []Declaration
}

// maxReasonLen matches the longest engine reason the TransferNode API accepts.
const maxReasonLen = 512

// Detect reads the node through h and returns what it can do. It fails only on invalid overrides or a
// cancelled context; everything it cannot read is recorded in the report instead.
func Detect(ctx context.Context, h Host, opts Options) (Report, error) {
	if err := opts.Overrides.Validate(); err != nil {
		return Report{}, fmt.Errorf("checking overrides: %w", err)
	}
	var r Report
	amd, un := detectAMD(ctx, h)
	r.Unreadable = append(r.Unreadable, un...)
	inv, un := scanPCI(h)
	r.Unreadable = append(r.Unreadable, un...)
	nv, un := detectNVIDIA(ctx, h, opts.OpenNVML, inv)
	r.Unreadable = append(r.Unreadable, un...)
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("detecting GPUs: %w", err)
	}
	r.NVSwitches = inv.nvSwitches
	r.GPUs = append(amd, nv...)
	for i := range r.GPUs {
		r.GPUs[i].Index = i
	}
	// NVIDIA peers were computed as positions within nv; shift them past the AMD GPUs.
	for i := len(amd); i < len(r.GPUs); i++ {
		for k := range r.GPUs[i].XGMIPeers {
			r.GPUs[i].XGMIPeers[k] += len(amd)
		}
	}
	if len(nv) > 0 {
		if b, err := readTrimmed(h, nvidiaProcVersion); err == nil {
			r.NVIDIADriver = strings.SplitN(b, "\n", 2)[0]
		}
		r.IMEXRegistered, r.IMEXChannels, un = readIMEX(h)
		r.Unreadable = append(r.Unreadable, un...)
	}
	r.NICs, un = detectNICs(h)
	r.Unreadable = append(r.Unreadable, un...)
	rankNICs(h, r.GPUs, r.NICs)
	r.GPUDirect, un = detectGPUDirect(h, r.GPUs, r.NICs)
	r.Unreadable = append(r.Unreadable, un...)
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("detecting NICs: %w", err)
	}
	for i := range r.GPUs {
		if r.GPUs[i].Fabric != nil {
			r.GPUs[i].Fabric.Source = SourceDiscovered
		}
	}
	applyDeclarations(&r, opts.Declarations, opts.Overrides.FabricDomain)
	if key := opts.Overrides.FabricDomain; key != "" {
		kind, _ := domainKind(key)
		for i := range r.GPUs {
			was := r.GPUs[i].FabricNote
			if r.GPUs[i].Fabric != nil {
				was = "hardware reports " + r.GPUs[i].Fabric.Domain
			}
			r.GPUs[i].Fabric = &Fabric{Kind: kind, Domain: key, Pinned: true, Source: SourceOverride}
			r.GPUs[i].FabricNote = "pinned by override"
			if was != "" {
				r.GPUs[i].FabricNote += " (" + was + ")"
			}
		}
	}
	r.Engines = engines(r, opts.Overrides)
	return r, nil
}

func engines(r Report, o Overrides) []Engine {
	disabled := map[string]bool{}
	for _, e := range o.DisabledEngines {
		disabled[e] = true
	}
	out := []Engine{xgmiEngine(r), fabricEngine(r), rdmaEngine(r), tcpEngine(r)}
	for i := range out {
		if disabled[out[i].Name] {
			by := o.DisabledBy
			if by == "" {
				by = "configuration"
			}
			hw := "unavailable"
			if out[i].Available {
				hw = "available"
			}
			out[i].Reason = fmt.Sprintf("disabled by %s (hardware: %s: %s)", by, hw, out[i].Reason)
			out[i].Available = false
		}
		if len(out[i].Reason) > maxReasonLen {
			out[i].Reason = out[i].Reason[:maxReasonLen-3] + "..."
		}
	}
	return out
}

func xgmiEngine(r Report) Engine {
	e := Engine{Name: EngineXGMI}
	if len(r.GPUs) == 0 {
		e.Reason = "no GPU detected"
		for _, u := range r.Unreadable {
			if strings.HasPrefix(u.Field, "kfd") || u.Field == "nvml" {
				e.Reason += "; some GPUs may be hidden: " + u.Reason
				break
			}
		}
		return e
	}
	pairs := 0
	for _, g := range r.GPUs {
		pairs += len(g.XGMIPeers)
	}
	pairs /= 2
	e.Available = true
	link := "XGMI"
	if r.GPUs[0].Vendor == VendorNVIDIA {
		link = "NVLink"
	}
	e.Reason = fmt.Sprintf("%s, %d %s peer pairs; same-GPU copies always", plural(len(r.GPUs), "GPU"), pairs, link)
	return e
}

func fabricEngine(r Report) Engine {
	e := Engine{Name: EngineFabric}
	members := map[string][]int{}
	var without []GPU
	for _, g := range r.GPUs {
		if g.Fabric != nil {
			members[g.Fabric.Domain] = append(members[g.Fabric.Domain], g.Index)
		} else {
			without = append(without, g)
		}
	}
	if len(r.GPUs) == 0 {
		e.Reason = "no GPU detected"
		return e
	}
	if len(members) == 0 {
		e.Reason = "no UALink vPOD and no NVLink clique (" + groupNotes(without) + ")"
		return e
	}
	keys := make([]string, 0, len(members))
	for k := range members {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	e.Available = true
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: GPUs %s", k, intRanges(members[k])))
	}
	pinned := false
	var declared []string
	for _, g := range r.GPUs {
		pinned = pinned || (g.Fabric != nil && g.Fabric.Pinned)
		if g.Fabric != nil && g.Fabric.Source == SourceDeclared && !slices.Contains(declared, g.Fabric.Declaration) {
			declared = append(declared, g.Fabric.Declaration)
		}
	}
	if strings.HasPrefix(keys[0], FabricNVLink+":") && r.IMEXChannels == 0 && !pinned {
		e.Available = false
		if r.IMEXRegistered {
			parts = append(parts, "but no IMEX channel device in "+imexChannelDir+" (an IMEX domain must provide one)")
		} else {
			parts = append(parts, "but the NVIDIA driver has no IMEX channels (nvidia-caps-imex-channels absent from /proc/devices)")
		}
	}
	if len(without) > 0 {
		parts = append(parts, "not in a domain: "+groupNotes(without))
	}
	switch {
	case len(declared) > 0:
		parts = append(parts, "declared by "+strings.Join(declared, ", "))
	case pinned:
		parts = append(parts, "domain pinned by override")
	}
	e.Reason = strings.Join(parts, "; ")
	return e
}

// groupNotes summarises why GPUs have no fabric domain, one clause per distinct reason.
func groupNotes(gpus []GPU) string {
	byNote := map[string][]int{}
	var order []string
	for _, g := range gpus {
		note := g.FabricNote
		if note == "" {
			note = "no fabric information"
		}
		if _, seen := byNote[note]; !seen {
			order = append(order, note)
		}
		byNote[note] = append(byNote[note], g.Index)
	}
	parts := make([]string, 0, len(order))
	for _, n := range order {
		parts = append(parts, fmt.Sprintf("GPU %s: %s", intRanges(byNote[n]), n))
	}
	return strings.Join(parts, "; ")
}

func rdmaEngine(r Report) Engine {
	e := Engine{Name: EngineRDMA}
	if len(r.NICs) == 0 {
		e.Reason = "no RDMA device in /sys/class/infiniband"
		for _, u := range r.Unreadable {
			if u.Field == "rdmaDevices" {
				e.Reason = u.Reason
			}
		}
		return e
	}
	usable := 0
	var notUsable []string
	for _, n := range r.NICs {
		if n.Usable() {
			usable++
			continue
		}
		notUsable = append(notUsable, fmt.Sprintf("%s/%d %s", n.Name, n.Port, whyPortUnusable(n)))
	}
	e.Available = usable > 0
	e.Reason = fmt.Sprintf("%d of %d ports usable", usable, len(r.NICs))
	if len(notUsable) > 0 {
		e.Reason += " (" + strings.Join(notUsable, "; ") + ")"
	}
	if len(r.GPUs) > 0 {
		e.Reason += fmt.Sprintf("; GPUDirect dma-buf=%t peer-mem=%t: %s", r.GPUDirect.DMABuf, r.GPUDirect.PeerMem, r.GPUDirect.Evidence)
	}
	return e
}

func whyPortUnusable(n NIC) string {
	switch {
	case n.State == "":
		return "state unreadable"
	case !n.Active():
		return n.State
	case n.LinkLayer == "Ethernet" && !n.RoCEv2:
		return "Ethernet without a RoCE v2 GID"
	case n.LinkLayer == "":
		return "link layer unreadable"
	}
	return "link layer " + n.LinkLayer
}

// intRanges writes sorted indexes compactly: 0-3,5.
func intRanges(v []int) string {
	s := append([]int(nil), v...)
	sort.Ints(s)
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, strconv.Itoa(s[i])+"-"+strconv.Itoa(s[j]))
		} else {
			parts = append(parts, strconv.Itoa(s[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// tcpEngine is always available for host memory; what it does for GPU memory depends on the vendor: the agent
// stages NVIDIA GPU memory through pinned host memory with the CUDA driver (whether that loads is the running
// agent's to say), and has no HIP staging for AMD GPU memory.
func tcpEngine(r Report) Engine {
	var nvidia, amd bool
	for _, g := range r.GPUs {
		nvidia = nvidia || g.Vendor == VendorNVIDIA
		amd = amd || g.Vendor == VendorAMD
	}
	reason := "host memory over TCP"
	if nvidia {
		reason += "; NVIDIA GPU memory staged through pinned host memory when the CUDA driver loads"
	}
	if amd {
		reason += "; AMD GPU memory not staged (no HIP staging)"
	}
	return Engine{Name: EngineTCP, Available: true, Reason: reason}
}
