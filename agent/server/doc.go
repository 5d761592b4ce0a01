// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package server is the agent's sidecar socket: the fabricxfer.agent.v1 Agent gRPC service on
// <socket dir>/<pool>/agent.sock and its fd socket agent.fd.sock beside it.
//
// Every connection is identified when it is accepted (SO_PEERCRED -> pid -> pod UID from /proc/<pid>/cgroup ->
// namespace through the API server) and admitted by the pool's allowedNamespaces; a refused caller's every call
// answers PermissionDenied with the reason. Memory a caller registers belongs to its connection: it is visible
// only to that caller (its pod), or to anyone in the pool who holds its descriptor or names its segment, and
// it is deregistered when the connection ends, once in-flight transfers settle. Limits (regions, bytes, in-flight
// transfers) apply per caller.
//
// The server ties the concerns together, each in a package of its own: identity (who is calling),
// fdsocket (agent.fd.sock), fastwire (the fast socket's wire), regiontable (registered memory, and the server's
// one lock), transfers (moving memory), poollend (pool memory) and refusals (what was turned away). This package
// keeps the sockets, the sessions and the Agent API's entry points, which find the caller's session and hand the
// call on.
//
// The agent wires it up with New and Serve:
//
//	srv, err := server.New(server.Options{SocketDir: dir, PoolNamespace: ns, PoolName: pool, NodeName: node,
//		Engine: composite, Identifier: identity.Identifier{ProcRoot: "/proc", Pods: resolver}, ...})
//	err = srv.Serve(ctx) // returns when ctx ends; sockets are removed
package server
