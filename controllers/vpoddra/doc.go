// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package vpoddra publishes, for every VPodTopology, a DRA pool of fabricxfer.io "vpod" devices whose node
// selector is that vPOD's nodes, the way NVIDIA's ComputeDomain channels bind IMEX domains: the pods that share
// one ResourceClaim on such a device can only be scheduled inside the vPOD. Each pod still claims its own node's
// transfer channel (agent/dra) for the socket; the vPOD device adds placement only, and the agents prepare it
// with no container edits.
package vpoddra
