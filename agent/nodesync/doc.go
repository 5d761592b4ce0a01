// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package nodesync keeps this node's objects in the API server in sync with the node: its TransferNode
// current (the status built by package nodestatus), its agent's heartbeat Lease alive, and the vPOD
// declarations naming the node watched (DeclarationWatch). Its Reporter (the agent's reporter) writes the
// object (spec, labels and an owner reference to the Node, so the report goes with its Node) with server-side
// apply, then, every period, re-detects the node: the status is applied again only when what it says changed (or
// the last write failed, or the object went missing), and the heartbeat is a small coordination.k8s.io Lease
// per (pool, node) in the pool's namespace, renewed every period, as the kubelet's node lease is. A change
// such as a NIC going down still shows within one period. With a watching client (Config.Watch) it also watches
// its own TransferNode, and only it, and writes back a status someone else changed, or an object someone
// deleted, as soon as it sees it: the agent owns its report.
package nodesync
