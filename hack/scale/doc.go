// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command scale simulates a GPU cluster's node agents against a real API server and measures the operator: how
// long pool and vPOD status take to converge after the last agent reports, the operator's peak memory, the
// request rate operator and agents put on the API server, and the size of one node's TransferNode.
//
// hack/scale.sh runs it (make scale N=1000); it is two steps:
//
//	scale nodes -n N                 creates N Node objects labelled for the pool
//	scale run -n N -operator-pid PID applies the pool, runs N simulated agents and prints the measurements
//	scale agent-user                 prints the user name of the pool's agent ServiceAccount
//
// With -agent-token-file the agents authenticate as the pool's agent ServiceAccount (hack/scale.sh gives the API
// server a static token for its user name and groups), so they have only the rights the operator binds to it
// and API Priority and Fairness queues them as it queues real agents; they start once the operator's DaemonSet
// exists and the API server grants them every request of a round. The harness's own setup and observer use the
// kubeconfig's admin. It prints what APF dispatched, rejected and queued (by priority level and flow schema) from
// pool creation to convergence, and the seats of each level that served requests.
//
// The agents are goroutines in one process that share one API client (one client per agent would measure
// this program, not the operator) but each keeps its own heartbeat period and writes its TransferNode and
// renews its heartbeat Lease through agent/nodesync, exactly as the agent binary does, with a detection report
// that stands for an 8-GPU, 8-NIC node in a scale-up domain. The agents' requests are counted by verb and
// resource (Leases beside TransferNode writes). Beside the convergence it prints the operator's own controller
// metrics before and after the last first report (reconcile times, queue waits, errors, retries, status
// codes), every client's writes, the agents' failed rounds by cause, when its own watch of the reports
// delivered them, and the CPU time of the API server, etcd, the operator and itself (hack/scale.sh passes their
// PIDs), so a slow run says whether the operator was busy, backing off, or waiting for its input, and who had
// the cores.
package main
