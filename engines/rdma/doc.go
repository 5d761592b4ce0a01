// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package rdma is the NIC-to-NIC engine: one-sided RDMA writes and reads over
// reliable-connected queue pairs, with GPU memory registered for GPUDirect
// (dma-buf first, the peer-memory module as the fallback) on the NIC nearest
// the GPU by PCIe distance.
//
// Each peer gets one set of queue pairs per (local NIC, remote NIC), set up
// on first use by exchanging connection info through [Exchanger] (the
// agent-to-agent channel); segments are cut into chunks, spread over the set
// with a bounded number of work requests in flight per queue pair, and every
// completion is mapped back to the plan that posted it, so a queue-pair error
// fails exactly the plans that had work on it and a lost peer fails them
// promptly. The hardware is behind [Provider]; package verbs binds
// libibverbs and package fakeverbs (here, beside the interface it fakes)
// stands in for it in tests. What the engine knows of the node's NICs comes
// in as [NICs] from its caller (the agent turns its detection report into
// them), so the transfer layer imports no detector.
package rdma
