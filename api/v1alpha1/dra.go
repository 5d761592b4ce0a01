// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import "strings"

// DRADriverName is the Dynamic Resource Allocation driver of the agents (node transfer channels) and of the
// operator (vPOD devices).
const DRADriverName = "fabricxfer.io"

// vpodDRAPoolPrefix starts every vPOD pool's name. An agent's pool is named after its node, and a node name
// holds no slash, so no node's pool is ever a vPOD's ("vpod-<x>" was: a node of that name and VPodTopology x
// published one pool from two places).
const vpodDRAPoolPrefix = "vpod/"

// VPodDRAPoolName is the DRA pool of the vPOD devices the operator publishes for a VPodTopology: vpod/<name>.
func VPodDRAPoolName(vpodObject string) string { return vpodDRAPoolPrefix + vpodObject }

// IsVPodDRAPool reports whether a pool of the driver is a vPOD's (the operator's) rather than a node's.
func IsVPodDRAPool(pool string) bool { return strings.HasPrefix(pool, vpodDRAPoolPrefix) }

// VPodDRASliceName is the ResourceSlice that publishes a vPOD pool (one per pool): the pool's name with its
// slash a dash, as object names take no slash.
func VPodDRASliceName(pool string) string {
	return "vpod-" + strings.TrimPrefix(pool, vpodDRAPoolPrefix)
}

// VPodDRAPoolOfLegacyName is the vPOD pool that a claim allocated before the pools' names held a slash names as
// vpod-<x>: vpod/<x>, whose slice kept its object name. ok is false for a name of no such form. Only a pool that
// is not the reading node's own may be read so (a node may be named vpod-<x>).
func VPodDRAPoolOfLegacyName(pool string) (renamed string, ok bool) {
	x, ok := strings.CutPrefix(pool, "vpod-")
	if !ok || x == "" {
		return "", false
	}
	return VPodDRAPoolName(x), true
}
