// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fdpass is the wire format of the agent's fd socket (<socket dir>/<pool>/agent.fd.sock), shared by
// the agent and its Go client: a caller hands the agent a file descriptor with SCM_RIGHTS and gets a one-time
// token back to name in a gRPC call, or presents a token and receives the descriptor the agent lends it.
//
// One exchange per connection keeps the protocol trivial to speak from any language (Python's
// socket.send_fds / recv_fds):
//
//	PUT\n            + SCM_RIGHTS(1 fd)   ->  OK <token>\n   |  ERR <reason>\n
//	PUT <n>\n        + SCM_RIGHTS(n fds)  ->  OK <token>\n   |  ERR <reason>\n   (1 <= n <= 253, in one message)
//	GET <token>\n                         ->  OK\n + SCM_RIGHTS(1 fd)  |  ERR <reason>\n
//
// A reason that starts with "RESOURCE_EXHAUSTED: " (ErrExhausted) is a limit that frees up by itself (descriptors
// waiting for this caller, connections open on the socket): back off and retry. The agent identifies the caller
// before it reads the request, closes every descriptor beyond the ones a PUT announces, and closes a connection
// that has not finished its exchange within 5 s.
package fdpass
