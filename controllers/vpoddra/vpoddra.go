// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package vpoddra

import (
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// DriverName is the DRA driver the devices belong to (the agents' driver).
const DriverName = v1alpha1.DRADriverName

// DefaultDevices is how many vpod devices each vPOD gets: one per group of pods that share a claim.
const DefaultDevices = 16

// PoolName is the DRA pool of a VPodTopology's devices: vpod/<VPodTopology name>.
func PoolName(vpodObject string) string { return v1alpha1.VPodDRAPoolName(vpodObject) }

// SliceName is the one ResourceSlice of a VPodTopology's pool: vpod-<VPodTopology name>.
func SliceName(vpodObject string) string { return v1alpha1.VPodDRASliceName(PoolName(vpodObject)) }

// Members are the nodes a vPOD's devices may be used on: the discovered members less the missing ones, or the
// declared members while nothing was discovered.
func Members(v v1alpha1.VPodTopology) []string {
	missing := map[string]bool{}
	for _, m := range v.Status.MissingMembers {
		missing[m] = true
	}
	src := v.Status.Members
	if len(src) == 0 {
		src = v.Spec.Members
	}
	var nodes []string
	for _, m := range src {
		if m.Node != "" && !missing[m.Node] {
			nodes = append(nodes, m.Node)
		}
	}
	sort.Strings(nodes)
	return nodes
}

// Resources are the pools of every vPOD that has a member, n devices each.
func Resources(domains []v1alpha1.VPodTopology, n int) *resourceslice.DriverResources {
	res := &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for _, v := range domains {
		nodes := slices.DeleteFunc(Members(v), func(node string) bool {
			// A node name is up to 253 characters, a label value 63: no node's hostname label can hold a longer
			// one, so leaving it out changes no match, and the selector stays one the API server takes.
			return len(validation.IsValidLabelValue(node)) > 0
		})
		if len(nodes) == 0 || v.Spec.Domain == "" {
			continue
		}
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":       {StringValue: ptr.To("vpod")},
			"vpodName":   {StringValue: ptr.To(v.Name)},
			"fabricKind": {StringValue: ptr.To(string(v.Spec.Kind))},
			"nodeCount":  {IntValue: ptr.To(int64(len(nodes)))},
			"gpuCount":   {IntValue: ptr.To(int64(v.Status.GPUs))},
		}
		// The node channels' attributes too, empty: a selector that reads an attribute a device lacks is a CEL
		// error that stops the scheduler's allocator, so both kinds of fabricxfer.io device carry the same set.
		for _, name := range []resourceapi.QualifiedName{"pool", "poolNamespace", "node"} {
			attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To("")}
		}
		for _, name := range []resourceapi.QualifiedName{"xgmi", "fabric", "rdma", "tcp"} {
			attrs[name] = resourceapi.DeviceAttribute{BoolValue: ptr.To(false)}
		}
		attrs["channel"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(-1))}
		attrs["fabricDomains"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(1))}
		vpod := v.Spec.Domain
		if len(vpod) > resourceapi.DeviceAttributeMaxValueLength {
			vpod = ""
		}
		attrs["vpod"] = resourceapi.DeviceAttribute{StringValue: ptr.To(vpod)}
		// The devices of a pool share one attribute map (read only: the slice controller copies what it is given);
		// a map per device cost 64 MB at 832 vPODs of 16 devices.
		devices := make([]resourceapi.Device, n)
		for i := range devices {
			devices[i] = resourceapi.Device{Name: fmt.Sprintf("vpod-%d", i), Attributes: attrs}
		}
		// A slice's node selector takes exactly one term, and a metadata.name field selector one value, so the
		// nodes are matched by the kubelet's hostname label, which is the node's name unless overridden.
		res.Pools[PoolName(v.Name)] = resourceslice.Pool{
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}},
			}}},
			Slices: []resourceslice.Slice{{Devices: devices}},
		}
	}
	return res
}
