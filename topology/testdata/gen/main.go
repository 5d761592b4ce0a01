// Command gen writes the fixture node trees under topology/testdata. Each tree holds only the files the
// detector reads, laid out as the kernel lays them out (real directories under /sys/devices, symlinks from
// /sys/bus/pci/devices and /sys/class/infiniband), so symlink resolution is exercised.
//
// Run from topology/testdata: go run ./gen
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	for name, build := range map[string]func(*tree){
		"mi300x-8gpu-roce":               func(t *tree) { mi300x(t, "") },
		"mi300x-8gpu-roce-nop2p":         func(t *tree) { mi300x(t, "nop2p") },
		"mi300x-8gpu-roce-nicdown":       func(t *tree) { mi300x(t, "nicdown") },
		"mi300x-8gpu-roce-norocev2":      func(t *tree) { mi300x(t, "norocev2") },
		"ualink-vpod-node-a":             func(t *tree) { ualinkNode(t, 0, "") },
		"ualink-vpod-node-b":             func(t *tree) { ualinkNode(t, 1, "") },
		"ualink-vpod-node-b-accel-error": func(t *tree) { ualinkNode(t, 1, "error") },
		"hgx-h200-8gpu-ib":               hgxH200,
		"gb200-tray-4gpu-clique":         gb200Tray,
		"rdma-only-node":                 rdmaOnly,
	} {
		t := &tree{root: name}
		if err := os.RemoveAll(name); err != nil {
			log.Fatal(err)
		}
		build(t)
		if t.err != nil {
			log.Fatalf("%s: %v", name, t.err)
		}
	}
}

type tree struct {
	root string
	err  error
}

func (t *tree) file(p, content string) {
	if t.err != nil {
		return
	}
	full := filepath.Join(t.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.err = err
		return
	}
	t.err = os.WriteFile(full, []byte(content), 0o644)
}

// link makes p a relative symlink to target (both node-absolute), as sysfs does.
func (t *tree) link(p, target string) {
	if t.err != nil {
		return
	}
	full := filepath.Join(t.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.err = err
		return
	}
	rel, err := filepath.Rel(filepath.Dir(p), target)
	if err != nil {
		t.err = err
		return
	}
	t.err = os.Symlink(rel, full)
}

// pciDev creates a PCI function at /sys/devices/<root>/<chain...> with its attributes and the
// /sys/bus/pci/devices link. chain runs from the root port to the function itself.
func (t *tree) pciDev(root string, chain []string, attrs map[string]string) string {
	dir := "/sys/devices/" + root + "/" + strings.Join(chain, "/")
	for k, v := range attrs {
		t.file(dir+"/"+k, v+"\n")
	}
	t.link("/sys/bus/pci/devices/"+chain[len(chain)-1], dir)
	return dir
}

func bdf(bus, dev, fn int) string { return fmt.Sprintf("0000:%02x:%02x.%d", bus, dev, fn) }

type nicSpec struct {
	name      string
	dir       string // PCI function directory
	linkLayer string
	state     string
	rate      string
	gids      map[int][2]string // index -> {gid, type}
	ndev      string
}

func (t *tree) nic(n nicSpec) {
	dev := n.dir + "/infiniband/" + n.name
	t.link("/sys/class/infiniband/"+n.name, dev)
	t.link(dev+"/device", n.dir)
	port := dev + "/ports/1"
	t.file(port+"/state", n.state+"\n")
	t.file(port+"/link_layer", n.linkLayer+"\n")
	t.file(port+"/rate", n.rate+"\n")
	for i, g := range n.gids {
		t.file(fmt.Sprintf("%s/gids/%d", port, i), g[0]+"\n")
		t.file(fmt.Sprintf("%s/gid_attrs/types/%d", port, i), g[1]+"\n")
		if n.ndev != "" {
			t.file(fmt.Sprintf("%s/gid_attrs/ndevs/%d", port, i), n.ndev+"\n")
		}
	}
}

const zeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"

func roceGIDs(ipv4Last int, v2 bool) map[int][2]string {
	mac := fmt.Sprintf("fe80:0000:0000:0000:0ac0:ebff:fe1e:%04x", ipv4Last)
	v4 := fmt.Sprintf("0000:0000:0000:0000:0000:ffff:0a00:%04x", ipv4Last)
	g := map[int][2]string{0: {mac, "IB/RoCE v1"}, 1: {mac, "RoCE v2"}, 2: {v4, "IB/RoCE v1"}, 3: {v4, "RoCE v2"}, 4: {zeroGID, ""}}
	if !v2 {
		g = map[int][2]string{0: {mac, "IB/RoCE v1"}, 2: {v4, "IB/RoCE v1"}}
	}
	return g
}

// kfdCPU writes a CPU node of the KFD topology.
func (t *tree) kfdCPU(node, cores int) {
	dir := fmt.Sprintf("/sys/class/kfd/kfd/topology/nodes/%d", node)
	t.file(dir+"/gpu_id", "0\n")
	t.file(dir+"/properties", fmt.Sprintf("cpu_cores_count %d\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\nio_links_count 0\np2p_links_count 0\ncpu_core_id_base %d\nsimd_id_base 0\nmax_waves_per_simd 0\nlds_size_in_kb 0\ngds_size_in_kb 0\nnum_gws 0\nwave_front_size 0\narray_count 0\nsimd_arrays_per_engine 0\ncu_per_simd_array 0\nsimd_per_cu 0\nmax_slots_scratch_cu 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nhive_id 0\nnum_sdma_engines 0\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 0\nnum_cp_queues 0\nmax_engine_clk_ccompute 3700\n", cores, node*cores))
}

type kfdGPUSpec struct {
	node, gpuID, deviceID, gfx, bus, renderMinor int
	hive, unique, memBytes                       uint64
	links                                        []kfdLinkSpec
}

type kfdLinkSpec struct {
	typ, to, weight, bw, flags int
}

func (t *tree) kfdGPU(g kfdGPUSpec) {
	dir := fmt.Sprintf("/sys/class/kfd/kfd/topology/nodes/%d", g.node)
	t.file(dir+"/gpu_id", fmt.Sprintf("%d\n", g.gpuID))
	t.file(dir+"/properties", fmt.Sprintf("cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\ncaches_count 480\nio_links_count %d\np2p_links_count 0\ncpu_core_id_base 0\nsimd_id_base 2147487744\nmax_waves_per_simd 8\nlds_size_in_kb 64\ngds_size_in_kb 0\nnum_gws 64\nwave_front_size 64\narray_count 32\nsimd_arrays_per_engine 1\ncu_per_simd_array 10\nsimd_per_cu 4\nmax_slots_scratch_cu 32\ngfx_target_version %d\nvendor_id 4098\ndevice_id %d\nlocation_id %d\ndomain 0\ndrm_render_minor %d\nhive_id %d\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 14\nnum_sdma_queues_per_engine 8\nnum_cp_queues 120\nmax_engine_clk_fcompute 2100\nlocal_mem_size %d\nfw_version 177\ncapability 746324608\ndebug_prop 1495\nsdma_fw_version 19\nunique_id %d\nnum_xcc 8\nmax_engine_clk_ccompute 3700\n",
		len(g.links), g.gfx, g.deviceID, g.bus<<8, g.renderMinor, g.hive, g.memBytes, g.unique))
	for i, l := range g.links {
		t.file(fmt.Sprintf("%s/io_links/%d/properties", dir, i), fmt.Sprintf("type %d\nversion_major 0\nversion_minor 0\nnode_from %d\nnode_to %d\nweight %d\nmin_latency 0\nmax_latency 0\nmin_bandwidth %d\nmax_bandwidth %d\nrecommended_transfer_size 0\nrecommended_sdma_engine_id_mask 0\nflags %d\n",
			l.typ, g.node, l.to, l.weight, l.bw, l.bw, l.flags))
	}
}

const kallsymsCommon = "0000000000000000 T ib_register_client\t[ib_core]\n0000000000000000 T ib_umem_get\t[ib_uverbs]\n0000000000000000 T ib_umem_dmabuf_get\t[ib_uverbs]\n0000000000000000 T pci_p2pdma_distance_many\n0000000000000000 T dma_buf_move_notify\n"

// mi300x is an 8 x MI300X node: full XGMI mesh, one 400G RoCE NIC under the same PCIe switch as each GPU.
func mi300x(t *tree, variant string) {
	gpuBus := []int{0x05, 0x2b, 0x5b, 0x65, 0x7d, 0xa5, 0xd5, 0xe7}
	hiveDir := ""
	t.kfdCPU(0, 96)
	t.kfdCPU(1, 96)
	for k, gb := range gpuBus {
		r := gb - 5 // root bus of this GPU's PCIe tree
		numa := "0"
		if k >= 4 {
			numa = "1"
		}
		root := fmt.Sprintf("pci0000:%02x", r)
		up := []string{bdf(r, 1, 1), bdf(r+1, 0, 0)}
		gpuChain := append(append([]string{}, up...), bdf(r+2, 0, 0), bdf(r+3, 0, 0), bdf(r+4, 0, 0), bdf(gb, 0, 0))
		gdir := t.pciDev(root, gpuChain, map[string]string{"vendor": "0x1002", "class": "0x120000", "numa_node": numa})
		// amdgpu's hive directory is real on the first GPU and a link on the others.
		if k == 0 {
			t.file(gdir+"/xgmi_hive_info/xgmi_hive_id", "14203577302455301311\n")
			hiveDir = gdir + "/xgmi_hive_info"
		} else {
			t.link(gdir+"/xgmi_hive_info", hiveDir)
		}
		nicChain := append(append([]string{}, up...), bdf(r+2, 1, 0), bdf(r+9, 0, 0))
		ndir := t.pciDev(root, nicChain, map[string]string{"vendor": "0x15b3", "class": "0x020000", "numa_node": numa})
		n := nicSpec{name: fmt.Sprintf("mlx5_%d", k), dir: ndir, linkLayer: "Ethernet", state: "4: ACTIVE",
			rate: "400 Gb/sec (4X NDR)", gids: roceGIDs(k+1, true), ndev: fmt.Sprintf("ens%df0np0", k+1)}
		if variant == "nicdown" && k == 3 {
			n.state = "1: DOWN"
		}
		if variant == "norocev2" && k == 5 {
			n.gids = roceGIDs(k+1, false)
		}
		t.nic(n)

		node := k + 2
		links := []kfdLinkSpec{{typ: 2, to: k / 4, weight: 20, bw: 64000, flags: 1}}
		for p := range gpuBus {
			if p == k {
				continue
			}
			flags := 1
			if variant == "nop2p" && k == 0 && p == 3 {
				flags = 17 // ENABLED | NO_PEER_TO_PEER_DMA
			}
			links = append(links, kfdLinkSpec{typ: 11, to: p + 2, weight: 15, bw: 64000, flags: flags})
		}
		t.kfdGPU(kfdGPUSpec{node: node, gpuID: 11900 + 1117*k, deviceID: 29857, gfx: 90402, bus: gb, renderMinor: 128 + k,
			hive: 14203577302455301311, unique: 4172683548931720000 + uint64(k)*7919, memBytes: 206158430208, links: links})
	}
	t.file("/sys/kernel/mm/memory_peers/amdkfd/version", "1.0\n")
	t.file("/proc/kallsyms", kallsymsCommon)
}

// ualinkNode is one 4-GPU node of a 2-node UALink vPOD (accels 0-3 on node a, 4-7 on node b).
func ualinkNode(t *tree, which int, variant string) {
	gpuBus := []int{0x05, 0x25, 0x85, 0xa5}
	linkType := []string{"UALink", "UALoE"}[which]
	t.kfdCPU(0, 64)
	t.kfdCPU(1, 64)
	for k, gb := range gpuBus {
		r := gb - 5
		numa := fmt.Sprint(k / 2)
		root := fmt.Sprintf("pci0000:%02x", r)
		up := []string{bdf(r, 1, 1), bdf(r+1, 0, 0)}
		gdir := t.pciDev(root, append(append([]string{}, up...), bdf(r+2, 0, 0), bdf(gb, 0, 0)),
			map[string]string{"vendor": "0x1002", "class": "0x120000", "numa_node": numa})
		state := "active"
		if variant == "error" && k == 3 {
			state = "error"
		}
		accel := which*4 + k
		for f, v := range map[string]string{
			"link_type": linkType, "accel_state": state, "accel_id": fmt.Sprint(accel),
			"ppod_id": "1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081", "ppod_size": "8", "vpod_id": "1", "vpod_size": "8",
			"vpod_active_accels": "0 1 2 3 4 5 6 7", "local_accels": fmt.Sprintf("%d %d %d %d", which*4, which*4+1, which*4+2, which*4+3),
			"addr_mode": "source-aliasing", "bandwidth": "200000", "latency": "100",
		} {
			t.file(gdir+"/ualink/"+f, v+"\n")
		}
		ndir := t.pciDev(root, append(append([]string{}, up...), bdf(r+2, 1, 0), bdf(r+4, 0, 0)),
			map[string]string{"vendor": "0x15b3", "class": "0x020000", "numa_node": numa})
		t.nic(nicSpec{name: fmt.Sprintf("mlx5_%d", k), dir: ndir, linkLayer: "Ethernet", state: "4: ACTIVE",
			rate: "400 Gb/sec (4X NDR)", gids: roceGIDs(16*which+k+1, true), ndev: fmt.Sprintf("ens%df0np0", k+1)})
		t.kfdGPU(kfdGPUSpec{node: k + 2, gpuID: 21000 + 311*k + 7*which, deviceID: 30112, gfx: 90500, bus: gb, renderMinor: 128 + k,
			unique: 6002300400500600000 + uint64(accel)*104729, memBytes: 309237645312,
			links: []kfdLinkSpec{{typ: 2, to: k / 2, weight: 20, bw: 64000, flags: 1}}})
	}
	t.file("/sys/kernel/mm/memory_peers/amdkfd/version", "1.0\n")
	t.file("/proc/kallsyms", kallsymsCommon)
}

const nvidiaOpenVersion = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Sun Oct 12 00:28:29 UTC 2026\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"

func nvidiaProc(t *tree, gpuBDFs []string, model string, imex bool) {
	for i, b := range gpuBDFs {
		t.file("/proc/driver/nvidia/gpus/"+b+"/information", fmt.Sprintf("Model: \t\t %s\nIRQ:   \t\t %d\nGPU UUID: \t GPU-%08x-7b1c-4f9e-9d1a-%012x\nVideo BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
			model, 300+i, 0x5e1f0000+i, 0xa1b2c3d40000+i, b, i))
	}
	t.file("/proc/driver/nvidia/version", nvidiaOpenVersion)
	devices := "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n195 nvidia-frontend\n234 nvidia-nvswitch\n235 nvidia-caps\n236 nvidia-uvm\n"
	if imex {
		devices += "237 nvidia-caps-imex-channels\n"
	}
	devices += "\nBlock devices:\n  7 loop\n259 blkext\n"
	t.file("/proc/devices", devices)
	if imex {
		// A character device in reality; the detector only lists the directory.
		t.file("/dev/nvidia-caps-imex-channels/channel0", "")
	}
	t.file("/sys/module/nvidia_peermem/version", "580.159.04\n")
	t.file("/proc/kallsyms", kallsymsCommon)
}

// hgxH200 is an 8 x H200 HGX board: NVSwitch NVLink between all GPUs, one NDR InfiniBand NIC on the same
// PCIe switch as each GPU. NVML answers come from hgx-h200-8gpu-ib.nvml.json.
func hgxH200(t *tree) {
	nicBus := []int{0x18, 0x40, 0x4f, 0x5e, 0x9a, 0xc0, 0xce, 0xdc}
	var gpus []string
	for k, nb := range nicBus {
		r := nb - 3
		numa := "0"
		if k >= 4 {
			numa = "1"
		}
		root := fmt.Sprintf("pci0000:%02x", r)
		up := []string{bdf(r, 1, 0), bdf(r+1, 0, 0)}
		gb := nb + 3
		t.pciDev(root, append(append([]string{}, up...), bdf(r+2, 1, 0), bdf(gb, 0, 0)),
			map[string]string{"vendor": "0x10de", "class": "0x030200", "numa_node": numa})
		gpus = append(gpus, bdf(gb, 0, 0))
		ndir := t.pciDev(root, append(append([]string{}, up...), bdf(r+2, 0, 0), bdf(nb, 0, 0)),
			map[string]string{"vendor": "0x15b3", "class": "0x020700", "numa_node": numa})
		t.nic(nicSpec{name: fmt.Sprintf("mlx5_%d", k), dir: ndir, linkLayer: "InfiniBand", state: "4: ACTIVE",
			rate: "400 Gb/sec (4X NDR)", gids: map[int][2]string{0: {fmt.Sprintf("fe80:0000:0000:0000:a088:c203:0012:%04x", 0x3456+k), "IB/RoCE v1"}}})
	}
	for s := 0; s < 4; s++ {
		t.pciDev("pci0000:00", []string{bdf(0, 3, s), bdf(5+s, 0, 0)},
			map[string]string{"vendor": "0x10de", "class": "0x068000", "numa_node": "0"})
	}
	nvidiaProc(t, gpus, "NVIDIA H200", true)
	var switches []string
	for s := 0; s < 4; s++ {
		switches = append(switches, fmt.Sprintf("00000000:%02X:00.0", 5+s))
	}
	writeNVML(t.root+".nvml.json", gpus, "NVIDIA H200", 150754820096, 18, switches, fabric{State: 3, Status: "SUCCESS", CliqueID: 0})
}

// gb200Tray is one compute tray of a GB200 NVL72 rack: 4 GPUs in one NVLink clique that spans trays, no
// NVSwitch on the tray's PCIe, IMEX channels, 4 InfiniBand NICs. NVML answers come from
// gb200-tray-4gpu-clique.nvml.json.
func gb200Tray(t *tree) {
	gpuBus := []int{0x01, 0x02, 0x41, 0x42}
	nicBus := []int{0x03, 0x04, 0x43, 0x44}
	var gpus []string
	for k := range gpuBus {
		dom := 0x0008
		if k >= 2 {
			dom = 0x0018
		}
		numa := fmt.Sprint(k / 2)
		root := fmt.Sprintf("pci%04x:00", dom)
		gb := fmt.Sprintf("%04x:%02x:00.0", dom, gpuBus[k])
		t.pciDev(root, []string{fmt.Sprintf("%04x:00:%02x.0", dom, k%2), gb},
			map[string]string{"vendor": "0x10de", "class": "0x030200", "numa_node": numa})
		gpus = append(gpus, gb)
		nb := fmt.Sprintf("%04x:%02x:00.0", dom, nicBus[k])
		ndir := t.pciDev(root, []string{fmt.Sprintf("%04x:00:%02x.0", dom, 2+k%2), nb},
			map[string]string{"vendor": "0x15b3", "class": "0x020700", "numa_node": numa})
		t.nic(nicSpec{name: fmt.Sprintf("mlx5_%d", k), dir: ndir, linkLayer: "InfiniBand", state: "4: ACTIVE",
			rate: "400 Gb/sec (4X NDR)", gids: map[int][2]string{0: {fmt.Sprintf("fe80:0000:0000:0000:b0c1:d203:0045:%04x", 0x100+k), "IB/RoCE v1"}}})
	}
	nvidiaProc(t, gpus, "NVIDIA GB200", true)
	// The tray's NVSwitches live in the NVLink switch trays, not on this PCIe: NVML shows remote bus ids
	// that sysfs does not.
	switches := []string{"00000000:00:00.0"}
	writeNVML(t.root+".nvml.json", gpus, "NVIDIA GB200", 199715979264, 18, switches,
		fabric{State: 3, Status: "SUCCESS", ClusterUUID: "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b", CliqueID: 32766})
}

type nvlink struct {
	Link        int    `json:"link"`
	Active      bool   `json:"active"`
	RemoteType  string `json:"remoteType,omitempty"`
	RemoteBusID string `json:"remoteBusID,omitempty"`
}

type fabric struct {
	State       uint8  `json:"state"`
	Status      string `json:"status"`
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueId"`
}

type nvmlDevice struct {
	Name        string   `json:"name"`
	UUID        string   `json:"uuid"`
	PCIBusID    string   `json:"pciBusID"`
	MemoryBytes uint64   `json:"memoryBytes"`
	NVLinks     []nvlink `json:"nvlinks"`
	P2PNVLink   string   `json:"p2pNVLink"`
	Fabric      fabric   `json:"fabric"`
}

// writeNVML writes what NVML answers on the node, in the shape topology/nvmlfake reads.
func writeNVML(file string, gpus []string, model string, mem uint64, links int, switches []string, fab fabric) {
	var devs []nvmlDevice
	for i, b := range gpus {
		d := nvmlDevice{Name: model, UUID: fmt.Sprintf("GPU-%08x-7b1c-4f9e-9d1a-%012x", 0x5e1f0000+i, 0xa1b2c3d40000+i),
			PCIBusID: "0000" + strings.ToUpper(b), MemoryBytes: mem, P2PNVLink: "OK", Fabric: fab}
		for l := 0; l < links; l++ {
			d.NVLinks = append(d.NVLinks, nvlink{Link: l, Active: true, RemoteType: "SWITCH", RemoteBusID: switches[l%len(switches)]})
		}
		devs = append(devs, d)
	}
	b, err := json.MarshalIndent(map[string]any{"devices": devs}, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
}

// rdmaOnly is a CPU node with one InfiniBand and one RoCE port and no GPU.
func rdmaOnly(t *tree) {
	ib := t.pciDev("pci0000:00", []string{bdf(0, 1, 0), bdf(1, 0, 0)},
		map[string]string{"vendor": "0x15b3", "class": "0x020700", "numa_node": "0"})
	t.nic(nicSpec{name: "mlx5_0", dir: ib, linkLayer: "InfiniBand", state: "4: ACTIVE",
		rate: "200 Gb/sec (4X HDR)", gids: map[int][2]string{0: {"fe80:0000:0000:0000:1070:fd03:00a1:b2c3", "IB/RoCE v1"}}})
	eth := t.pciDev("pci0000:80", []string{bdf(0x80, 1, 0), bdf(0x81, 0, 0)},
		map[string]string{"vendor": "0x15b3", "class": "0x020000", "numa_node": "1"})
	t.nic(nicSpec{name: "mlx5_1", dir: eth, linkLayer: "Ethernet", state: "4: ACTIVE",
		rate: "100 Gb/sec (4X EDR)", gids: roceGIDs(0x21, true), ndev: "ens1f0np0"})
	t.file("/proc/kallsyms", kallsymsCommon)
	t.file("/proc/devices", "Character devices:\n  1 mem\n  4 tty\n231 infiniband_verbs\n\nBlock devices:\n  7 loop\n")
}
