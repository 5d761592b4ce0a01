// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package topology detects what a node can do for GPU memory transfers: its GPUs (AMD through KFD and sysfs,
// NVIDIA through sysfs, procfs and NVML), the peer links between them (XGMI, NVLink), the scale-up fabric
// domain each GPU belongs to (AMD UALink vPOD, NVIDIA NVLink clique), its RDMA NICs ranked by PCIe distance to
// each GPU, and GPUDirect support. Everything is read through a Host rooted at a configurable directory, so
// tests run against fixture trees under testdata/.
//
// Detection never guesses: a fact that could not be read is left empty and recorded, with the reason, in an
// Unreadable entry next to where it would have been. A file that returns EPERM is "not visible" to the agent,
// which is different from "absent".
//
// The package has no Kubernetes imports; agent/nodestatus converts a Report into the TransferNode status.
package topology
