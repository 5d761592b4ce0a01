// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package stack assembles the agent's transfer side from flags: the composite engine (same-node host copies,
// the tcp engine over the pool's mTLS, the caller's GPU engines, and the engines built on the agent-to-agent
// channel through Deps.PeerEngines, such as rdma), pool memory, the agent-to-agent channel and the sidecar
// socket server, and runs them together. cmd/agent registers Config's flags and calls Run; xferctl runs the same stack as a
// local agent for benchmarks and demos.
package node
