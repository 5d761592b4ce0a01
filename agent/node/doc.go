// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package node assembles the node agent: options and a detection of the node in, a running agent out. New
// builds the agent of a Kubernetes node (the watch of its declared vPODs, the reporter that keeps its
// TransferNode current, the DRA driver when asked for, and the transfer side); NewStandalone builds the transfer
// side alone, for a machine without Kubernetes. The transfer side is built in one straight line, each part once
// what it needs exists: the GPU runtimes the detected GPUs need, the pool's certificates, the tcp engine and the
// agent-to-agent channel, the engines that work through the channel (fabric, rdma), the same-node engine and
// the composite, what GetInfo reports as running, pool memory and the sidecar socket server. Serve runs that
// line for a caller that has its own report (xferctl's local agent). The options register their own flags, so
// cmd/agent only parses flags and calls this package.
package node
