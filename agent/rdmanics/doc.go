// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package rdmanics hands the rdma engine the NIC facts of the agent's detection report: every RDMA port and
// whether it is usable, each GPU's ports by PCIe distance, and detection's verdict on the engine. The engine
// takes them as arguments (engines/ imports no detector); this package is the one place that knows both sides.
package rdmanics
