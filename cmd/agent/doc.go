// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command agent is fabricxfer's node agent. "agent detect" prints what the node can do (GPUs, peer links,
// fabric domains, RDMA NICs, engines) as a table for admins or as the TransferNode status JSON; "agent run"
// keeps the node's TransferNode current and serves the pool's socket until SIGTERM; "agent standalone" serves
// the socket on one machine without Kubernetes; "agent certs" writes a pool's certificates for standalone
// agents. The command parses flags; agent/node assembles and runs the agent.
package main
