// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fabricxfer/fabricxfer/topology"
	"github.com/fabricxfer/fabricxfer/topology/nvmlfake"
)

var (
	mi300xGPUBus = []int{0x05, 0x2b, 0x5b, 0x65, 0x7d, 0xa5, 0xd5, 0xe7}
	mi300xNICBus = []int{0x09, 0x2f, 0x5f, 0x69, 0x81, 0xa9, 0xd9, 0xeb}
)

func TestMI300XFullMeshRoCE(t *testing.T) {
	r := mustDetect(t, fixture(t, "mi300x-8gpu-roce"), topology.Options{})
	if len(r.GPUs) != 8 || len(r.NICs) != 8 {
		t.Fatalf("got %d GPUs and %d NICs, want 8 and 8", len(r.GPUs), len(r.NICs))
	}
	for k, g := range r.GPUs {
		wantNUMA := k / 4
		var wantPeers []int
		for p := 0; p < 8; p++ {
			if p != k {
				wantPeers = append(wantPeers, p)
			}
		}
		if g.Index != k || g.Vendor != "amd" || g.Model != "gfx942" ||
			g.PCIBusID != fmt.Sprintf("0000:%02x:00.0", mi300xGPUBus[k]) || g.NUMANode != wantNUMA ||
			g.MemoryBytes != 206158430208 || fmt.Sprint(g.XGMIPeers) != fmt.Sprint(wantPeers) || g.Fabric != nil {
			t.Errorf("GPU %d = %+v", k, g)
		}
		// amdgpu's hive id is read through the hive directory (a link on all but the first GPU).
		if g.XGMIHive != "14203577302455301311" || g.Partitions != 0 {
			t.Errorf("GPU %d hive %q partitions %d", k, g.XGMIHive, g.Partitions)
		}
		if g.FabricNote != "no UALink" || len(g.Unreadable) != 0 {
			t.Errorf("GPU %d fabric note %q, unreadable %v", k, g.FabricNote, g.Unreadable)
		}
		// Own NIC first (same PCIe switch), then the NICs of the same socket, then the other socket's.
		if g.NICs[0].NIC != fmt.Sprintf("mlx5_%d", k) || g.NICs[0].Level != topology.LevelPXB {
			t.Errorf("GPU %d nearest NIC %+v, want mlx5_%d at PXB", k, g.NICs[0], k)
		}
		for _, n := range g.NICs[1:4] {
			if n.Level != topology.LevelNODE {
				t.Errorf("GPU %d ranking %s: want 3 NODE NICs after its own", k, nicRanking(g))
			}
		}
		for _, n := range g.NICs[4:] {
			if n.Level != topology.LevelSYS {
				t.Errorf("GPU %d ranking %s: want 4 SYS NICs last", k, nicRanking(g))
			}
		}
	}
	for k, n := range r.NICs {
		if n.Name != fmt.Sprintf("mlx5_%d", k) || n.Port != 1 || n.State != "ACTIVE" || n.LinkLayer != "Ethernet" ||
			!n.RoCEv2 || n.RateGbps != 400 || n.PCIBusID != fmt.Sprintf("0000:%02x:00.0", mi300xNICBus[k]) ||
			n.NUMANode != k/4 || fmt.Sprint(n.NearestGPUs) != fmt.Sprintf("[%d]", k) || n.NearestLevel != "PXB" ||
			n.NetDev != fmt.Sprintf("ens%df0np0", k+1) || len(n.Unreadable) != 0 {
			t.Errorf("NIC %d = %+v", k, n)
		}
	}
	wantEngines := []topology.Engine{
		{Name: "xgmi", Available: true, Reason: "8 GPUs, 28 XGMI peer pairs; same-GPU copies always"},
		{Name: "fabric", Available: false, Reason: "no UALink vPOD and no NVLink clique (GPU 0-7: no UALink)"},
		{Name: "rdma", Available: true, Reason: "8 of 8 ports usable; GPUDirect dma-buf=true peer-mem=true: peer-mem /sys/kernel/mm/memory_peers/amdkfd/version; dma-buf (ib_umem_dmabuf_get, PCI P2PDMA)"},
		{Name: "tcp", Available: true, Reason: "host memory over TCP; AMD GPU memory not staged (no HIP staging)"},
	}
	if fmt.Sprint(r.Engines) != fmt.Sprint(wantEngines) {
		t.Errorf("engines\n got %+v\nwant %+v", r.Engines, wantEngines)
	}
	if !r.GPUDirect.PeerMem || !r.GPUDirect.DMABuf || len(r.Unreadable) != 0 {
		t.Errorf("gpuDirect %+v, node unreadable %v", r.GPUDirect, r.Unreadable)
	}
}

func TestMI300XDegradedVariants(t *testing.T) {
	healthy := mustDetect(t, fixture(t, "mi300x-8gpu-roce"), topology.Options{})
	t.Run("link flagged no-P2P", func(t *testing.T) {
		r := mustDetect(t, fixture(t, "mi300x-8gpu-roce-nop2p"), topology.Options{})
		d := diff(t, healthy, r)
		// Only node 2 -> node 5 is flagged, but peers stay symmetric: both lose each other.
		assertDiffPaths(t, d, ".gpus[0].xgmiPeers", ".gpus[3].xgmiPeers", ".engines[0].reason")
		if d[".gpus[0].xgmiPeers"][1] != "[1,2,4,5,6,7]" || d[".gpus[3].xgmiPeers"][1] != "[1,2,4,5,6,7]" ||
			!strings.HasPrefix(d[".engines[0].reason"][1], `"8 GPUs, 27 XGMI peer pairs`) {
			t.Errorf("diff %v", d)
		}
	})
	t.Run("NIC down", func(t *testing.T) {
		r := mustDetect(t, fixture(t, "mi300x-8gpu-roce-nicdown"), topology.Options{})
		d := diff(t, healthy, r)
		assertDiffPaths(t, d, ".nics[3].state", ".engines[2].reason")
		if d[".nics[3].state"][1] != `"DOWN"` || !strings.HasPrefix(d[".engines[2].reason"][1], `"7 of 8 ports usable (mlx5_3/1 DOWN)`) {
			t.Errorf("diff %v", d)
		}
		if !engineOf(t, r, "rdma").Available {
			t.Error("rdma unavailable with 7 usable ports")
		}
	})
	t.Run("Ethernet port without RoCE v2", func(t *testing.T) {
		r := mustDetect(t, fixture(t, "mi300x-8gpu-roce-norocev2"), topology.Options{})
		d := diff(t, healthy, r)
		assertDiffPaths(t, d, ".nics[5].roceV2", ".nics[5].netDev", ".engines[2].reason")
		if !strings.HasPrefix(d[".engines[2].reason"][1], `"7 of 8 ports usable (mlx5_5/1 Ethernet without a RoCE v2 GID)`) {
			t.Errorf("diff %v", d)
		}
	})
	t.Run("KFD node not visible", func(t *testing.T) {
		h := alteredHost{Host: fixture(t, "mi300x-8gpu-roce"), errs: map[string]error{
			"/sys/class/kfd/kfd/topology/nodes/5/gpu_id": syscall.EPERM,
		}}
		r := mustDetect(t, h, topology.Options{})
		if len(r.GPUs) != 7 {
			t.Fatalf("got %d GPUs, want the 7 visible ones", len(r.GPUs))
		}
		for _, g := range r.GPUs {
			if g.PCIBusID == "0000:65:00.0" {
				t.Errorf("hidden GPU reported: %+v", g)
			}
			if len(g.XGMIPeers) != 6 {
				t.Errorf("GPU %d peers %v, want the 6 other visible GPUs", g.Index, g.XGMIPeers)
			}
		}
		want := topology.Unreadable{Field: "kfdNode5", Reason: "not visible: /sys/class/kfd/kfd/topology/nodes/5/gpu_id: permission denied; a GPU there is not counted"}
		if len(r.Unreadable) != 1 || r.Unreadable[0] != want {
			t.Errorf("node unreadable %v, want %v", r.Unreadable, want)
		}
	})
	t.Run("port state and GPU NUMA unreadable", func(t *testing.T) {
		ibState := "/sys/class/infiniband/mlx5_2/ports/1/state"
		numa := "/sys/bus/pci/devices/0000:7d:00.0/numa_node"
		h := alteredHost{Host: fixture(t, "mi300x-8gpu-roce"), errs: map[string]error{ibState: syscall.EACCES, numa: syscall.EIO}}
		r := mustDetect(t, h, topology.Options{})
		d := diff(t, healthy, r)
		// Only NIC 2, GPU 4 (its NUMA node and therefore its NIC ranking) and the rdma reason change.
		assertDiffWithin(t, d, ".nics[2].", ".gpus[4].numaNode", ".gpus[4].unreadable[0].", ".gpus[4].nics[", ".engines[2].reason")
		if r.NICs[2].State != "" || r.NICs[2].Unreadable[0].Reason != "not visible: "+ibState+": permission denied" {
			t.Errorf("NIC 2 %+v", r.NICs[2])
		}
		if r.GPUs[4].NUMANode != -1 || r.GPUs[4].Unreadable[0].Reason != numa+": input/output error" {
			t.Errorf("GPU 4 %+v", r.GPUs[4])
		}
		// Without its NUMA node, GPU 4 cannot call the other socket-1 NICs NODE any more; it says SYS rather
		// than guessing they are near.
		for _, n := range r.GPUs[4].NICs[1:] {
			if n.Level != topology.LevelSYS {
				t.Errorf("GPU 4 ranking %s", nicRanking(r.GPUs[4]))
			}
		}
	})
}

func TestUALinkVPODNodes(t *testing.T) {
	const key = "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1"
	a := mustDetect(t, fixture(t, "ualink-vpod-node-a"), topology.Options{})
	b := mustDetect(t, fixture(t, "ualink-vpod-node-b"), topology.Options{})
	for name, r := range map[string]topology.Report{"a": a, "b": b} {
		if len(r.GPUs) != 4 || len(r.NICs) != 4 {
			t.Fatalf("node %s: %d GPUs, %d NICs", name, len(r.GPUs), len(r.NICs))
		}
		for _, g := range r.GPUs {
			if g.Fabric == nil || g.Fabric.Kind != "ualink" || g.Fabric.Domain != key || g.Fabric.Size != 8 || len(g.XGMIPeers) != 0 {
				t.Errorf("node %s GPU %d: fabric %+v peers %v", name, g.Index, g.Fabric, g.XGMIPeers)
			}
			if g.NICs[0].NIC != fmt.Sprintf("mlx5_%d", g.Index) || g.NICs[0].Level != topology.LevelPIX {
				t.Errorf("node %s GPU %d ranking %s", name, g.Index, nicRanking(g))
			}
		}
		fab := engineOf(t, r, "fabric")
		if !fab.Available || fab.Reason != key+": GPUs 0-3" {
			t.Errorf("node %s fabric engine %+v", name, fab)
		}
		if x := engineOf(t, r, "xgmi"); !x.Available || x.Reason != "4 GPUs, 0 XGMI peer pairs; same-GPU copies always" {
			t.Errorf("node %s xgmi engine %+v", name, x)
		}
	}
	if !strings.Contains(a.GPUs[0].FabricNote, "UALink UALink") || !strings.Contains(b.GPUs[0].FabricNote, "UALink UALoE") {
		t.Errorf("link types: %q / %q", a.GPUs[0].FabricNote, b.GPUs[0].FabricNote)
	}

	t.Run("GPU in UALink error state", func(t *testing.T) {
		r := mustDetect(t, fixture(t, "ualink-vpod-node-b-accel-error"), topology.Options{})
		d := diff(t, b, r)
		assertDiffPaths(t, d, ".gpus[3].fabric.kind", ".gpus[3].fabric.domain", ".gpus[3].fabric.source", ".gpus[3].fabric.size", ".gpus[3].fabricNote", ".engines[1].reason")
		want := key + `: GPUs 0-2; not in a domain: GPU 3: UALink accel_state "error" is not usable (want ready or active)`
		if e := engineOf(t, r, "fabric"); !e.Available || e.Reason != want {
			t.Errorf("fabric engine %+v, want reason %q", e, want)
		}
	})
	t.Run("ppod_id spelled as 0x hex and vpod 0", func(t *testing.T) {
		dir := "/sys/bus/pci/devices/0000:25:00.0/ualink/"
		h := alteredHost{Host: fixture(t, "ualink-vpod-node-a"), contents: map[string]string{
			"/sys/bus/pci/devices/0000:05:00.0/ualink/ppod_id":   "0x1C9E2F4A6B7D4E119A2B3C4D5E6F7081\n",
			"/sys/bus/pci/devices/0000:05:00.0/ualink/link_type": "UALLink\n",
			dir + "vpod_id": "0\n", dir + "accel_state": "ppod_configured\n",
		}}
		r := mustDetect(t, h, topology.Options{})
		if r.GPUs[0].Fabric == nil || r.GPUs[0].Fabric.Domain != key {
			t.Errorf("GPU 0 fabric %+v, want %s", r.GPUs[0].Fabric, key)
		}
		if r.GPUs[1].Fabric != nil || !strings.Contains(r.GPUs[1].FabricNote, "ppod_configured") {
			t.Errorf("GPU 1 fabric %+v note %q", r.GPUs[1].Fabric, r.GPUs[1].FabricNote)
		}
	})
	t.Run("vpod_size zero, past the bound, not a number or absent", func(t *testing.T) {
		// The size only times the operator's writes: a bad one leaves it unknown, the domain stays.
		at := func(bus string) string { return "/sys/bus/pci/devices/0000:" + bus + ":00.0/ualink/vpod_size" }
		h := alteredHost{Host: fixture(t, "ualink-vpod-node-a"),
			contents: map[string]string{at("05"): "0\n", at("25"): "65537\n", at("85"): "eight\n"},
			errs:     map[string]error{at("a5"): syscall.ENOENT}}
		r := mustDetect(t, h, topology.Options{})
		for i, g := range r.GPUs {
			if g.Fabric == nil || g.Fabric.Domain != key || g.Fabric.Size != 0 {
				t.Errorf("GPU %d fabric %+v, want domain %s of unknown size", i, g.Fabric, key)
			}
			if bad := i < 3; strings.Contains(g.FabricNote, "vpod_size") != bad || len(g.Unreadable) != 0 {
				t.Errorf("GPU %d note %q unreadable %v: want the bad size noted (%v), nothing unreadable", i, g.FabricNote, g.Unreadable, bad)
			}
		}
	})
	t.Run("ualink attribute not visible", func(t *testing.T) {
		p := "/sys/bus/pci/devices/0000:85:00.0/ualink/vpod_id"
		r := mustDetect(t, alteredHost{Host: fixture(t, "ualink-vpod-node-a"), errs: map[string]error{p: syscall.EPERM}}, topology.Options{})
		g := r.GPUs[2]
		if g.Fabric != nil || len(g.Unreadable) != 1 || g.Unreadable[0].Field != "fabric" || g.Unreadable[0].Reason != "not visible: "+p+": permission denied" {
			t.Errorf("GPU 2 %+v", g)
		}
	})
}

func hgxNVML(t testing.TB) nvmlfake.Machine {
	t.Helper()
	m, err := nvmlfake.Load(filepath.Join("testdata", "hgx-h200-8gpu-ib.nvml.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestHGXH200InfiniBand(t *testing.T) {
	r := mustDetect(t, fixture(t, "hgx-h200-8gpu-ib"), topology.Options{OpenNVML: hgxNVML(t).Opener()})
	if len(r.GPUs) != 8 || len(r.NICs) != 8 {
		t.Fatalf("got %d GPUs and %d NICs", len(r.GPUs), len(r.NICs))
	}
	// Whether the CUDA driver loads is the running agent's to say; detection says what tcp would do.
	if e := engineOf(t, r, "tcp"); !e.Available || e.Reason != "host memory over TCP; NVIDIA GPU memory staged through pinned host memory when the CUDA driver loads" {
		t.Errorf("tcp engine %+v", e)
	}
	nicBus := []int{0x18, 0x40, 0x4f, 0x5e, 0x9a, 0xc0, 0xce, 0xdc}
	for k, g := range r.GPUs {
		if g.Vendor != "nvidia" || g.PCIBusID != fmt.Sprintf("0000:%02x:00.0", nicBus[k]+3) || g.NUMANode != k/4 ||
			g.UUID != fmt.Sprintf("GPU-%08x-7b1c-4f9e-9d1a-%012x", 0x5e1f0000+k, 0xa1b2c3d40000+k) ||
			g.MemoryBytes != 150754820096 || len(g.XGMIPeers) != 7 || g.ActiveNVLinks != 18 || g.Fabric != nil ||
			len(g.Unreadable) != 0 {
			t.Errorf("GPU %d = %+v", k, g)
		}
		if g.FabricNote != "NVML fabric state COMPLETED, cluster UUID zero: NVLink within the node only" {
			t.Errorf("GPU %d fabric note %q", k, g.FabricNote)
		}
		if g.NICs[0].NIC != fmt.Sprintf("mlx5_%d", k) || g.NICs[0].Level != topology.LevelPIX {
			t.Errorf("GPU %d ranking %s", k, nicRanking(g))
		}
	}
	for k, n := range r.NICs {
		if n.LinkLayer != "InfiniBand" || n.State != "ACTIVE" || n.RoCEv2 || n.RateGbps != 400 ||
			fmt.Sprint(n.NearestGPUs) != fmt.Sprintf("[%d]", k) || n.NearestLevel != "PIX" {
			t.Errorf("NIC %d = %+v", k, n)
		}
	}
	if e := engineOf(t, r, "xgmi"); e.Reason != "8 GPUs, 28 NVLink peer pairs; same-GPU copies always" {
		t.Errorf("xgmi %+v", e)
	}
	if e := engineOf(t, r, "fabric"); e.Available || e.Reason != "no UALink vPOD and no NVLink clique (GPU 0-7: NVML fabric state COMPLETED, cluster UUID zero: NVLink within the node only)" {
		t.Errorf("fabric %+v", e)
	}
	if e := engineOf(t, r, "rdma"); !e.Available || !strings.HasPrefix(e.Reason, "8 of 8 ports usable; GPUDirect dma-buf=true peer-mem=true: peer-mem /sys/module/nvidia_peermem/version") {
		t.Errorf("rdma %+v", e)
	}
	if r.NVSwitches != 4 || !r.IMEXRegistered || r.IMEXChannels != 1 || !strings.Contains(r.NVIDIADriver, "Open Kernel Module") || len(r.Unreadable) != 0 {
		t.Errorf("node facts: switches %d imex %t/%d driver %q unreadable %v", r.NVSwitches, r.IMEXRegistered, r.IMEXChannels, r.NVIDIADriver, r.Unreadable)
	}

	t.Run("NVML unavailable", func(t *testing.T) {
		r := mustDetect(t, fixture(t, "hgx-h200-8gpu-ib"), topology.Options{OpenNVML: nvmlfake.Machine{InitError: "ERROR_LIBRARY_NOT_FOUND"}.Opener()})
		if len(r.GPUs) != 8 {
			t.Fatalf("got %d GPUs, want the 8 on the PCI bus", len(r.GPUs))
		}
		g := r.GPUs[0]
		// The UUID still comes from the driver's procfs; what only NVML knows is marked, not guessed.
		if g.UUID != "GPU-5e1f0000-7b1c-4f9e-9d1a-a1b2c3d40000" || len(g.XGMIPeers) != 0 || g.Fabric != nil || g.MemoryBytes != 0 {
			t.Errorf("GPU 0 = %+v", g)
		}
		fields := map[string]bool{}
		for _, u := range g.Unreadable {
			fields[u.Field] = u.Reason == "NVML unavailable: nvmlInit: ERROR_LIBRARY_NOT_FOUND"
		}
		if !fields["memoryBytes"] || !fields["xgmiPeers"] || !fields["fabric"] || len(fields) != 3 {
			t.Errorf("GPU 0 unreadable %v", g.Unreadable)
		}
		if e := engineOf(t, r, "fabric"); e.Reason != "no UALink vPOD and no NVLink clique (GPU 0-7: NVML unavailable: nvmlInit: ERROR_LIBRARY_NOT_FOUND)" {
			t.Errorf("fabric %+v", e)
		}
	})
	t.Run("one GPU pair without NVLink P2P", func(t *testing.T) {
		m := hgxNVML(t)
		m.Devices[2].P2POverrides = map[string]string{"6": "NOT_SUPPORTED"}
		r := mustDetect(t, fixture(t, "hgx-h200-8gpu-ib"), topology.Options{OpenNVML: m.Opener()})
		if fmt.Sprint(r.GPUs[2].XGMIPeers) != "[0 1 3 4 5 7]" || fmt.Sprint(r.GPUs[6].XGMIPeers) != "[0 1 3 4 5 7]" {
			t.Errorf("peers of 2: %v, of 6: %v", r.GPUs[2].XGMIPeers, r.GPUs[6].XGMIPeers)
		}
	})
}

func TestGB200NVLinkClique(t *testing.T) {
	const key = "nvlink:6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b.32766"
	m, err := nvmlfake.Load(filepath.Join("testdata", "gb200-tray-4gpu-clique.nvml.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := mustDetect(t, fixture(t, "gb200-tray-4gpu-clique"), topology.Options{OpenNVML: m.Opener()})
	for _, g := range r.GPUs {
		if g.Fabric == nil || g.Fabric.Domain != key || g.Fabric.Kind != "nvlink" {
			t.Errorf("GPU %d fabric %+v", g.Index, g.Fabric)
		}
	}
	if e := engineOf(t, r, "fabric"); !e.Available || e.Reason != key+": GPUs 0-3" {
		t.Errorf("fabric %+v", e)
	}
	if r.GPUs[0].PCIBusID != "0008:01:00.0" || r.GPUs[3].PCIBusID != "0018:42:00.0" || r.NVSwitches != 0 {
		t.Errorf("GPUs %s..%s, switches %d", r.GPUs[0].PCIBusID, r.GPUs[3].PCIBusID, r.NVSwitches)
	}

	t.Run("registration in progress on one GPU", func(t *testing.T) {
		m2 := m
		m2.Devices = append([]nvmlfake.Device(nil), m.Devices...)
		f := *m2.Devices[1].Fabric
		f.State = topology.FabricStateInProgress
		m2.Devices[1].Fabric = &f
		r := mustDetect(t, fixture(t, "gb200-tray-4gpu-clique"), topology.Options{OpenNVML: m2.Opener()})
		want := key + ": GPUs 0,2-3; not in a domain: GPU 1: NVML fabric state IN_PROGRESS: fabric registration not complete"
		if e := engineOf(t, r, "fabric"); !e.Available || e.Reason != want {
			t.Errorf("fabric %+v\nwant %q", e, want)
		}
	})
	t.Run("no IMEX channel device", func(t *testing.T) {
		noDevices := map[string]error{"/dev/nvidia-caps-imex-channels": syscall.ENOENT}
		r := mustDetect(t, alteredHost{Host: fixture(t, "gb200-tray-4gpu-clique"), errs: noDevices}, topology.Options{OpenNVML: m.Opener()})
		want := key + ": GPUs 0-3; but no IMEX channel device in /dev/nvidia-caps-imex-channels (an IMEX domain must provide one)"
		if e := engineOf(t, r, "fabric"); e.Available || e.Reason != want || r.GPUs[0].Fabric == nil {
			t.Errorf("fabric %+v, GPU 0 fabric %+v", e, r.GPUs[0].Fabric)
		}
		h := alteredHost{Host: fixture(t, "gb200-tray-4gpu-clique"), errs: noDevices, contents: map[string]string{
			"/proc/devices": "Character devices:\n195 nvidia-frontend\n235 nvidia-caps\n\nBlock devices:\n  7 loop\n",
		}}
		r = mustDetect(t, h, topology.Options{OpenNVML: m.Opener()})
		if e := engineOf(t, r, "fabric"); e.Available || !strings.HasSuffix(e.Reason, "(nvidia-caps-imex-channels absent from /proc/devices)") {
			t.Errorf("fabric %+v", e)
		}
	})
}

func TestRDMAOnlyNode(t *testing.T) {
	r := mustDetect(t, fixture(t, "rdma-only-node"), topology.Options{})
	if len(r.GPUs) != 0 || len(r.NICs) != 2 || len(r.Unreadable) != 0 {
		t.Fatalf("GPUs %v NICs %v unreadable %v", r.GPUs, r.NICs, r.Unreadable)
	}
	ib, eth := r.NICs[0], r.NICs[1]
	if ib.Name != "mlx5_0" || ib.LinkLayer != "InfiniBand" || ib.RateGbps != 200 || ib.NUMANode != 0 || ib.PCIBusID != "0000:01:00.0" || len(ib.NearestGPUs) != 0 {
		t.Errorf("IB port %+v", ib)
	}
	if eth.Name != "mlx5_1" || eth.LinkLayer != "Ethernet" || !eth.RoCEv2 || eth.RateGbps != 100 || eth.NUMANode != 1 || eth.NetDev != "ens1f0np0" {
		t.Errorf("RoCE port %+v", eth)
	}
	want := []topology.Engine{
		{Name: "xgmi", Reason: "no GPU detected"},
		{Name: "fabric", Reason: "no GPU detected"},
		{Name: "rdma", Available: true, Reason: "2 of 2 ports usable"},
		{Name: "tcp", Available: true, Reason: "host memory over TCP"},
	}
	if fmt.Sprint(r.Engines) != fmt.Sprint(want) {
		t.Errorf("engines %+v", r.Engines)
	}
}

func TestOverrides(t *testing.T) {
	h := fixture(t, "mi300x-8gpu-roce")
	const pinned = "ualink:42/7"
	r := mustDetect(t, h, topology.Options{Overrides: topology.Overrides{
		DisabledEngines: []string{"rdma"}, DisabledBy: "pool spec", FabricDomain: pinned,
	}})
	for _, g := range r.GPUs {
		if g.Fabric == nil || g.Fabric.Domain != pinned || !g.Fabric.Pinned || g.FabricNote != "pinned by override (no UALink)" {
			t.Errorf("GPU %d fabric %+v note %q", g.Index, g.Fabric, g.FabricNote)
		}
	}
	if e := engineOf(t, r, "fabric"); !e.Available || e.Reason != pinned+": GPUs 0-7; domain pinned by override" {
		t.Errorf("fabric %+v", e)
	}
	if e := engineOf(t, r, "rdma"); e.Available || !strings.HasPrefix(e.Reason, "disabled by pool spec (hardware: available: 8 of 8 ports usable") {
		t.Errorf("rdma %+v", e)
	}
	for _, bad := range []topology.Overrides{{DisabledEngines: []string{"nvlink"}}, {FabricDomain: "1c9e/1"}, {FabricDomain: "ualink:"}} {
		if _, err := topology.Detect(t.Context(), h, topology.Options{Overrides: bad}); err == nil {
			t.Errorf("Detect accepted overrides %+v", bad)
		}
	}
	if _, err := topology.ParseEngineList("fabric, RDMA"); err != nil {
		t.Errorf("ParseEngineList: %v", err)
	}
	if _, err := topology.ParseEngineList("fabric,ib"); err == nil {
		t.Error("ParseEngineList accepted an unknown engine")
	}
}

func TestEmptyHostRoot(t *testing.T) {
	h, err := topology.NewDirHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := mustDetect(t, h, topology.Options{})
	if len(r.GPUs)+len(r.NICs)+len(r.Unreadable) != 0 || engineOf(t, r, "tcp").Available != true || engineOf(t, r, "xgmi").Available {
		t.Errorf("empty root report %+v", r)
	}
	if _, err := topology.NewDirHost(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("NewDirHost accepted a missing directory")
	}
}

func BenchmarkDetectMI300X(b *testing.B) {
	h := fixture(b, "mi300x-8gpu-roce")
	for b.Loop() {
		if _, err := topology.Detect(b.Context(), h, topology.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDetectHGXH200(b *testing.B) {
	h := fixture(b, "hgx-h200-8gpu-ib")
	opts := topology.Options{OpenNVML: hgxNVML(b).Opener()}
	for b.Loop() {
		if _, err := topology.Detect(b.Context(), h, opts); err != nil {
			b.Fatal(err)
		}
	}
}
