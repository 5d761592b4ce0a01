// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

// DRADriverName is the Dynamic Resource Allocation driver of the agents (node transfer channels) and of the
// operator (vPOD devices).
const DRADriverName = "fabricxfer.io"

// VPodDRAPoolName is the DRA pool of the vPOD devices the operator publishes for a VPodTopology.
func VPodDRAPoolName(vpodObject string) string { return "vpod-" + vpodObject }
