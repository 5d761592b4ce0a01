// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package v1alpha1 holds the fabricxfer.io/v1alpha1 API: TransferPool (which nodes run agents and what they
// may do), TransferNode (what one node's agent detected) and VPodTopology (GPUs across nodes that share one
// scale-up domain). Validation lives here as OpenAPI and CEL markers so the API server refuses bad objects.
//
// +kubebuilder:object:generate=true
// +groupName=fabricxfer.io
package v1alpha1
