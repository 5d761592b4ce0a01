// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"crypto/sha256"
	"fmt"

	"github.com/fabricxfer/fabricxfer/topology"
)

// Nodes come in blocks of blockNodes (36 nodes, 288 GPUs); blocks cycle through three kinds of scale-up
// domain so one run exercises every vPOD size the operator must group:
//   - nvlink72: NVL72-style NVLink cliques of 72 GPUs, 9 whole nodes each (4 per block);
//   - ualink18: UALink pods of 72 GPUs cut into vPODs of 18, so a node may sit in two vPODs (16 per block);
//   - ualink4:  UALink vPODs of 4 GPUs, one GPU from each of 4 nodes, rail-wise (72 per block).
const (
	blockNodes  = 36
	gpusPerNode = 8
	nicsPerNode = 8
)

type domainKind int

const (
	nvlink72 domainKind = iota
	ualink18
	ualink4
)

func (k domainKind) String() string {
	return [...]string{"nvlink72", "ualink18", "ualink4"}[k]
}

// nodeName is the name of simulated node i.
func nodeName(i int) string { return fmt.Sprintf("scale-node-%05d", i) }

// uuidOf makes a stable UUID-shaped string from a seed, for GPU UUIDs and fabric identities.
func uuidOf(seed string) string {
	s := sha256.Sum256([]byte(seed))
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}

// domainOf says which scale-up domain GPU g of node i belongs to, and the kind of its block.
func domainOf(i, g int) (key string, kind domainKind) {
	block, pos := i/blockNodes, i%blockNodes
	kind = domainKind(block % 3)
	switch kind {
	case nvlink72:
		clique := pos / 9
		return fmt.Sprintf("nvlink:%s.%d", uuidOf(fmt.Sprintf("cluster-%d", block)), clique), kind
	case ualink18:
		pod := pos / 9
		local := (pos%9)*gpusPerNode + g // GPU number within the 72-GPU pod
		return fmt.Sprintf("ualink:%s/%d", uuidOf(fmt.Sprintf("ppod-%d-%d", block, pod)), local/18), kind
	default:
		group := pos / 4
		return fmt.Sprintf("ualink:%s/%d", uuidOf(fmt.Sprintf("ppod-%d-%d", block, group)), g), kind
	}
}

// domainShape is what the harness expects of one scale-up domain.
type domainShape struct {
	kind  domainKind
	nodes int // distinct member nodes
	gpus  int // member GPUs: what a UALink member reports as the vPOD's size
}

// expectedDomains maps every domain key of an n-node cluster to its kind and member count.
func expectedDomains(n int) map[string]domainShape {
	members := map[string]map[int]bool{}
	gpus := map[string]int{}
	kinds := map[string]domainKind{}
	for i := 0; i < n; i++ {
		for g := 0; g < gpusPerNode; g++ {
			key, kind := domainOf(i, g)
			if members[key] == nil {
				members[key] = map[int]bool{}
			}
			members[key][i] = true
			kinds[key] = kind
			gpus[key]++
		}
	}
	out := make(map[string]domainShape, len(members))
	for k, m := range members {
		out[k] = domainShape{kind: kinds[k], nodes: len(m), gpus: gpus[k]}
	}
	return out
}

// syntheticReport is what detection would find on simulated node i: 8 GPUs fully connected by XGMI/NVLink,
// each in its scale-up domain (a UALink one with its vpod_size, from domains), and 8 InfiniBand NICs, one per GPU
// at PIX distance, GPUDirect by dma-buf.
func syntheticReport(i int, domains map[string]domainShape) topology.Report {
	_, kind := domainOf(i, 0)
	vendor, fabric, mem := topology.VendorAMD, topology.FabricUALink, int64(256)<<30 // MI325X
	if kind == nvlink72 {
		vendor, fabric, mem = topology.VendorNVIDIA, topology.FabricNVLink, int64(189)<<30 // GB200
	}
	var r topology.Report
	for g := 0; g < gpusPerNode; g++ {
		peers := make([]int, 0, gpusPerNode-1)
		for p := 0; p < gpusPerNode; p++ {
			if p != g {
				peers = append(peers, p)
			}
		}
		key, _ := domainOf(i, g)
		uuid := uuidOf(fmt.Sprintf("%s/gpu%d", nodeName(i), g))
		if vendor == topology.VendorNVIDIA {
			uuid = "GPU-" + uuid
		}
		r.GPUs = append(r.GPUs, topology.GPU{
			Index: g, Vendor: vendor, UUID: uuid,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x0c+g*0x10), NUMANode: g / 4, MemoryBytes: mem,
			XGMIPeers: peers,
			Fabric:    &topology.Fabric{Kind: fabric, Domain: key},
		})
		if fabric == topology.FabricUALink {
			r.GPUs[g].Fabric.Size = domains[key].gpus
		}
	}
	for n := 0; n < nicsPerNode; n++ {
		r.NICs = append(r.NICs, topology.NIC{
			Name: fmt.Sprintf("mlx5_%d", n), Port: 1, State: "ACTIVE", LinkLayer: "InfiniBand", RateGbps: 400,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x0d+n*0x10), NUMANode: n / 4, NearestGPUs: []int{n},
		})
	}
	r.GPUDirect = topology.GPUDirect{DMABuf: true, Evidence: "dma-buf export supported by the GPU driver"}
	r.Engines = []topology.Engine{
		{Name: topology.EngineXGMI, Available: true, Reason: "8 GPUs, every pair peer-linked"},
		{Name: topology.EngineFabric, Available: true, Reason: fmt.Sprintf("%s domains on all 8 GPUs", fabric)},
		{Name: topology.EngineRDMA, Available: true, Reason: "8 active InfiniBand ports, GPUDirect by dma-buf"},
		{Name: topology.EngineTCP, Available: true, Reason: "always available"},
	}
	return r
}
