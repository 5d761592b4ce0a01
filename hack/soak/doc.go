// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command soak drives a running local fabricxfer deployment (control plane, operator, one agent per node, as
// hack/demo.sh up leaves it) for a set duration and checks that it stays healthy under churn:
//
//   - transfers: workers move host memory through the agents' sockets with the Go client, within a node and
//     across nodes (tcp engine), writes and reads of random sizes and offsets, each with a deadline; every
//     transfer that completes is checked byte for byte by SHA-256 of both ends (the program owns both memories);
//   - agent churn: one node's agent is stopped (SIGTERM and SIGKILL in turn) and started again with its exact
//     command line; clients of that agent Recover and carry on; transfers that fail meanwhile must fail with an
//     error, never hang, and are counted as failed;
//   - pool churn: extra TransferPools (selecting no node) are created and deleted one after another; each must
//     get its DaemonSet, ServiceAccount, RBAC and Secrets and lose them all after deletion;
//   - sampling: RSS, threads and open fds of the long-lived processes (operator, the agents that are not
//     churned, this program) from /proc, and goroutines where a /metrics endpoint says go_goroutines (the
//     operator) or from the runtime (this program).
//
// It fails when a transfer is lost (submitted but neither completed nor failed when the run ends), exceeds its
// deadline, completes with wrong bytes or fails outside a churn window; when a long-lived process exits, or
// its RSS, goroutines or fds grew past the tolerance over the warm-up baseline (an agent's RSS may also grow by
// its collector's heap floor, internal/gcfloor.Default: garbage it holds by design); when a churned agent or a pool
// does not converge within its deadline; or when objects of deleted pools are left behind. The last line is
//
//	soak: D s, T transfers (F failed during churn, L lost), agent RSS a→b MiB, goroutines c→d, fds e→f
//
// hack/soak.sh brings the deployment up, runs this program and tears everything down (make soak).
package main
