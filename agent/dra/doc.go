// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package dra is the agent's Dynamic Resource Allocation driver (driver name fabricxfer.io): it publishes the
// node's transfer-channel devices in a ResourceSlice, with attributes a claim's CEL selector can test (pool,
// node, vPOD / fabric domain key, engines, GPU count), and serves the kubelet's NodePrepareResources and
// NodeUnprepareResources through k8s.io/dynamic-resource-allocation's kubelet plugin helper. Preparing a claim
// writes a CDI spec that mounts the pool's socket directory at /run/fabricxfer in the claim's containers and
// sets FABRICXFER_SOCKET, so an inference pod reaches its agent through a ResourceClaim instead of a hostPath
// volume.
package dra
