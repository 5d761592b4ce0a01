// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// DriverName is the DRA driver's name: the domain of its device attributes, the prefix of its CDI kind, the
// name the kubelet knows its plugin by.
const DriverName = v1alpha1.DRADriverName

// ContainerSocketDir is where a prepared claim mounts the pool's socket directory in a container, and
// ContainerSocket the socket a client finds there ($FABRICXFER_SOCKET).
const (
	ContainerSocketDir = "/run/fabricxfer"
	ContainerSocket    = ContainerSocketDir + "/agent.sock"
	// SocketEnv names the socket for the clients, which read it when given no path.
	SocketEnv = "FABRICXFER_SOCKET"
)

// DefaultChannels is how many transfer-channel devices a node publishes: one per pod that holds a claim on it.
// A ResourceSlice holds at most 128 devices (resourceapi.ResourceSliceMaxDevices).
const DefaultChannels = 64

// Device attribute names (in the driver's domain: device.attributes["fabricxfer.io"].vpod in CEL).
const (
	AttrPool          = "pool"
	AttrPoolNamespace = "poolNamespace"
	AttrNode          = "node"
	AttrVPod          = "vpod"     // the fabric domain key of the node's GPUs (ualink:<ppod>/<vpod>, nvlink:<cluster>.<clique>)
	AttrVPodName      = "vpodName" // the VPodTopology object of that domain
	AttrFabricKind    = "fabricKind"
	AttrDomains       = "fabricDomains" // how many distinct fabric domains the node's GPUs are in
	AttrGPUCount      = "gpuCount"
	AttrChannel       = "channel"
	// AttrType is "channel" on these devices and "vpod" on the operator's vPOD devices (controllers/vpoddra).
	AttrType      = "type"
	AttrNodeCount = "nodeCount"
)

// Facts are what the node's devices say about it, taken from the agent's detection report.
type Facts struct {
	Node          string
	PoolNamespace string
	Pool          string
	GPUs          int
	// Domains are the distinct fabric domain keys of the node's GPUs, sorted; FabricKind is the first one's kind.
	Domains    []string
	FabricKind string
	// Engines maps each engine name (xgmi, fabric, rdma, tcp) to whether it is available on this node.
	Engines map[string]bool
}

// FactsFrom reads Facts from a detection report.
func FactsFrom(node, poolNamespace, pool string, rep topology.Report) Facts {
	f := Facts{Node: node, PoolNamespace: poolNamespace, Pool: pool, GPUs: len(rep.GPUs), Engines: map[string]bool{}}
	seen := map[string]string{}
	for _, g := range rep.GPUs {
		if g.Fabric != nil && g.Fabric.Domain != "" {
			seen[g.Fabric.Domain] = g.Fabric.Kind
		}
	}
	for d := range seen {
		f.Domains = append(f.Domains, d)
	}
	sort.Strings(f.Domains)
	if len(f.Domains) > 0 {
		f.FabricKind = seen[f.Domains[0]]
	}
	for _, e := range rep.Engines {
		f.Engines[e.Name] = e.Available
	}
	return f
}

// PoolName is the DRA pool of a node's devices: the node's name (one agent, of one TransferPool, per node).
func PoolName(node string) string { return node }

// DeviceName is the name of channel i.
func DeviceName(i int) string { return fmt.Sprintf("channel-%d", i) }

// Devices are the node's transfer-channel devices, each carrying every fact as an attribute a CEL selector can
// test. Every device has every string attribute, empty where the node has no such fact (no fabric domain) or
// the value is longer than the API allows (64 characters): a selector that reads a missing attribute fails
// with a CEL error, and the scheduler's allocator then stops at that device instead of skipping it.
func Devices(f Facts, channels int) []resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrGPUCount: {IntValue: ptr.To(int64(f.GPUs))},
		AttrDomains:  {IntValue: ptr.To(int64(len(f.Domains)))},
		// The vPOD devices' one (controllers/vpoddra), so both kinds carry the same attributes.
		AttrNodeCount: {IntValue: ptr.To(int64(1))},
	}
	str := func(name resourceapi.QualifiedName, v string) {
		if len(v) > resourceapi.DeviceAttributeMaxValueLength {
			v = ""
		}
		attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
	}
	str(AttrPool, f.Pool)
	str(AttrPoolNamespace, f.PoolNamespace)
	str(AttrNode, f.Node)
	vpod, vpodName := "", ""
	if len(f.Domains) > 0 {
		vpod, vpodName = f.Domains[0], v1alpha1.DomainObjectName(f.Domains[0])
	}
	str(AttrVPod, vpod)
	str(AttrVPodName, vpodName)
	str(AttrFabricKind, f.FabricKind)
	for _, name := range []string{"xgmi", "fabric", "rdma", "tcp"} {
		attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{BoolValue: ptr.To(f.Engines[name])}
	}
	devices := make([]resourceapi.Device, channels)
	for i := range devices {
		a := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(attrs)+1)
		for k, v := range attrs {
			a[k] = v
		}
		a[AttrChannel] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
		a[AttrType] = resourceapi.DeviceAttribute{StringValue: ptr.To("channel")}
		devices[i] = resourceapi.Device{Name: DeviceName(i), Attributes: a}
	}
	return devices
}
