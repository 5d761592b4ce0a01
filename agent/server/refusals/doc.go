// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package refusals counts what the agent's pod-facing sockets turned away: connections and requests refused
// at the edge (fabricxfer_agent_edge_refusals_total, by socket and reason) and requests refused because the
// caller was at one of its limits (fabricxfer_agent_limit_refusals_total, by limit). The agent server, its fd
// socket, its region table, its transfers and its pool lending all charge the same counters.
//
// Refusals are rare, so counting one may look its labels up; a request that is served pays nothing here.
package refusals
