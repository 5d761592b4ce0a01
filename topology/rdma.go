// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

const (
	infinibandDir    = "/sys/class/infiniband"
	maxRDMADevices   = 256
	maxPortsPerDev   = 64
	maxGIDsInspected = 256
)

// detectNICs reads every RDMA device port under /sys/class/infiniband.
func detectNICs(h Host) ([]NIC, []Unreadable) {
	devs, err := h.ReadDir(infinibandDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, []Unreadable{{Field: "rdmaDevices", Reason: whyUnreadable(infinibandDir, err)}}
	}
	if len(devs) > maxRDMADevices {
		devs = devs[:maxRDMADevices]
	}
	var nics []NIC
	var unreadable []Unreadable
	for _, dev := range devs {
		base := infinibandDir + "/" + dev
		portNames, err := h.ReadDir(base + "/ports")
		if err != nil {
			unreadable = append(unreadable, Unreadable{Field: "rdmaDevice " + clip(dev), Reason: whyUnreadable(base+"/ports", err)})
			continue
		}
		var devUnreadable []Unreadable
		pciPath, bdf, numa := "", "", -1
		if p, err := h.Realpath(base + "/device"); err != nil {
			devUnreadable = append(devUnreadable, Unreadable{Field: "pciBusID", Reason: whyUnreadable(base+"/device", err)})
		} else if b, err := canonicalBDF(path.Base(p)); err != nil {
			devUnreadable = append(devUnreadable, Unreadable{Field: "pciBusID", Reason: fmt.Sprintf("%s/device resolves to %s, not a PCI function", base, p)})
		} else {
			pciPath, bdf = p, b
			s, err := readTrimmed(h, p+"/numa_node")
			if err != nil {
				devUnreadable = append(devUnreadable, Unreadable{Field: "numaNode", Reason: whyUnreadable(p+"/numa_node", err)})
			} else if v, err := parseNUMANode(s); err != nil {
				devUnreadable = append(devUnreadable, Unreadable{Field: "numaNode", Reason: err.Error()})
			} else {
				numa = v
			}
		}
		for _, port := range numericNames(portNames, maxPortsPerDev+1) {
			if port == 0 {
				continue // ports are numbered from 1
			}
			n := NIC{Name: dev, Port: int(port), PCIBusID: bdf, NUMANode: numa, pciPath: pciPath}
			n.Unreadable = append(n.Unreadable, devUnreadable...)
			readPort(h, fmt.Sprintf("%s/ports/%d", base, port), &n)
			nics = append(nics, n)
		}
	}
	return nics, unreadable
}

func readPort(h Host, dir string, n *NIC) {
	if s, err := readTrimmed(h, dir+"/state"); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "state", Reason: whyUnreadable(dir+"/state", err)})
	} else if st, err := parsePortState(s); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "state", Reason: err.Error()})
	} else {
		n.State = st
	}
	if s, err := readTrimmed(h, dir+"/link_layer"); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "linkLayer", Reason: whyUnreadable(dir+"/link_layer", err)})
	} else if ll, err := parseLinkLayer(s); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "linkLayer", Reason: err.Error()})
	} else {
		n.LinkLayer = ll
	}
	if s, err := readTrimmed(h, dir+"/rate"); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "rateGbps", Reason: whyUnreadable(dir+"/rate", err)})
	} else if r, err := parseRate(s); err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "rateGbps", Reason: err.Error()})
	} else {
		n.RateGbps = r
	}
	if n.LinkLayer == "Ethernet" {
		readRoCE(h, dir, n)
	}
}

// readRoCE looks for a routable GID whose type is RoCE v2. Unpopulated entries read EINVAL, which is normal.
func readRoCE(h Host, dir string, n *NIC) {
	idx, err := h.ReadDir(dir + "/gids")
	if err != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "roceV2", Reason: whyUnreadable(dir+"/gids", err)})
		return
	}
	var typeErr error
	for _, i := range numericNames(idx, maxGIDsInspected) {
		raw, err := readTrimmed(h, fmt.Sprintf("%s/gids/%d", dir, i))
		if err != nil {
			continue
		}
		gid, err := parseGID(raw)
		if err != nil || !gidRoutable(gid) {
			continue
		}
		typ, err := readTrimmed(h, fmt.Sprintf("%s/gid_attrs/types/%d", dir, i))
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				typeErr = err
			}
			continue
		}
		if typ != "RoCE v2" {
			continue
		}
		n.RoCEv2 = true
		if nd, err := readTrimmed(h, fmt.Sprintf("%s/gid_attrs/ndevs/%d", dir, i)); err == nil {
			n.NetDev = nd
		}
		return
	}
	if typeErr != nil {
		n.Unreadable = append(n.Unreadable, Unreadable{Field: "roceV2", Reason: whyUnreadable(dir+"/gid_attrs/types", typeErr)})
	}
}

// Peer-memory clients (NCCL and RCCL look for the same files).
var (
	nvidiaPeerMemFiles = []string{
		"/sys/kernel/mm/memory_peers/nv_mem/version",
		"/sys/kernel/mm/memory_peers/nv_mem_nc/version",
		"/sys/module/nvidia_peermem/version",
	}
	amdPeerMemFiles = []string{
		"/sys/kernel/mm/memory_peers/amdkfd/version",
		"/sys/kernel/memory_peers/amdkfd/version",
		"/sys/memory_peers/amdkfd/version",
	}
)

// detectGPUDirect decides whether NICs can reach GPU memory directly: through a peer-memory client (the
// vendor's module registered with the RDMA core) or through dma-buf (the RDMA core imports dma-bufs and the
// GPU driver exports device memory as dma-buf).
func detectGPUDirect(h Host, gpus []GPU, nics []NIC) (GPUDirect, []Unreadable) {
	var gd GPUDirect
	if len(gpus) == 0 {
		gd.Evidence = "no GPU"
		return gd, nil
	}
	if len(nics) == 0 {
		gd.Evidence = "no RDMA NIC"
		return gd, nil
	}
	hasAMD, hasNVIDIA := false, false
	for _, g := range gpus {
		hasAMD = hasAMD || g.Vendor == VendorAMD
		hasNVIDIA = hasNVIDIA || g.Vendor == VendorNVIDIA
	}
	var evidence []string
	var unreadable []Unreadable
	var files []string
	if hasNVIDIA {
		files = append(files, nvidiaPeerMemFiles...)
	}
	if hasAMD {
		files = append(files, amdPeerMemFiles...)
	}
	for _, f := range files {
		if _, err := h.ReadFile(f); err == nil {
			gd.PeerMem = true
			evidence = append(evidence, "peer-mem "+f)
			break
		}
	}
	syms, symErr := h.ReadFile("/proc/kallsyms")
	if symErr != nil {
		unreadable = append(unreadable, Unreadable{Field: "gpuDirect", Reason: whyUnreadable("/proc/kallsyms", symErr) + "; dma-buf support not checked"})
	}
	// ROCm's amdkfd peer client registers lazily (on the first KFD process), so the RDMA core's peer-memory
	// API is what RCCL trusts when the file is not there yet.
	if !gd.PeerMem && hasAMD && symErr == nil && kallsymsHas(syms, "ib_register_peer_memory_client") {
		gd.PeerMem = true
		evidence = append(evidence, "peer-mem API ib_register_peer_memory_client (amdkfd registers on first use)")
	}
	if symErr == nil && kallsymsHas(syms, "ib_umem_dmabuf_get") {
		switch {
		case hasNVIDIA && nvidiaOpenModule(h):
			gd.DMABuf = true
			evidence = append(evidence, "dma-buf (ib_umem_dmabuf_get, NVIDIA open kernel module)")
		case hasAMD && kallsymsHas(syms, "pci_p2pdma_distance_many"):
			gd.DMABuf = true
			evidence = append(evidence, "dma-buf (ib_umem_dmabuf_get, PCI P2PDMA)")
		}
	}
	if len(evidence) == 0 {
		evidence = append(evidence, "no peer-memory client and no dma-buf import path found")
	}
	gd.Evidence = strings.Join(evidence, "; ")
	return gd, unreadable
}

func nvidiaOpenModule(h Host) bool {
	b, err := h.ReadFile(nvidiaProcVersion)
	return err == nil && bytes.Contains(b, []byte("Open Kernel Module"))
}

// kallsymsHas reports whether /proc/kallsyms lists the symbol (as a whole name, with or without a module).
func kallsymsHas(syms []byte, name string) bool {
	if name == "" {
		return false
	}
	needle := []byte(" " + name)
	rest := syms
	for {
		i := bytes.Index(rest, needle)
		if i < 0 {
			return false
		}
		end := i + len(needle)
		if end == len(rest) || rest[end] == '\n' || rest[end] == '\t' || rest[end] == ' ' {
			return true
		}
		rest = rest[end:]
	}
}
