// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package tcp is the universal fallback engine: it moves host memory between agents on different nodes over
// TCP (optionally TLS, e.g. the agents' mTLS), for pairs no faster engine claims.
//
// Each agent serves its registered host regions on one listener; a region's descriptor carries that address in
// Handles.TCP. To move bytes to or from a peer, the engine dials several connections to it and stripes every
// plan across them in chunks (Options.ChunkBytes); small scattered segments (KV blocks) travel many to a
// vectored request. Requests are pipelined on each connection, and a per-peer budget of bytes in flight
// (Options.MaxInFlightBytes) gives back-pressure. Payloads go straight between the socket and registered
// memory, without intermediate copies, on both sides.
//
// A peer that closes its connections, resets them, or sends nothing for Options.Liveness (1 s) while requests
// wait for its answers is lost: every request in flight to it fails at once with an *engines.PeerLostError
// naming the node and its address, and the next transfer dials it again. Any byte received counts as life,
// and the serving side sends keepalives while it receives a long payload, so healthy links carry almost no
// extra traffic. Dialing is bounded by Options.DialTimeout (2 s), so transfers to a
// peer behind a partition fail fast too. Preconnect opens a peer's connections ahead of its first transfer
// (the agent does so when a peer appears in its directory); Disconnect closes them.
//
// Writes can carry a notification (engines.SubmitOptions.Notify): after every chunk to a node was
// acknowledged, the engine sends it on the same connections and the transfer succeeds only once that node's
// handler has run.
//
// Claimed pairs: exactly one side on this node, both sides host memory (the local one with a view in this
// process), the remote one reachable over TCP, and not both sides carrying RDMA keys (the rdma engine's pairs).
// GPU memory is not staged through host memory: the engine has no seam to a GPU copy yet, so it refuses GPU
// regions and says so.
//
// Wire protocol, big-endian. Connection start: client "FXT1", its node name and the node it expects (u16
// length-prefixed); server "FXT1", status byte, its node name. Requests: op u8 (1 write, 2 read, 3 notify,
// 4 vectored write, 5 vectored read), reserved u8, id length u16, request id u64, offset u64, length u64,
// memory id; vectored requests then carry a u32 part count and (offset u64, length u32) per part; then the
// payload of writes and notifications. Responses: op u8, status u8 (0 ok), reserved u16, request id u64,
// length u64, then the data of reads or the error text. The server checks every range against the region
// before touching it, and answers a refused write only after consuming its payload, so the stream stays usable.
// While it receives a payload the server sends a keepalive (op 6, id 0, no data) at least every 100 ms, so a
// client tells a slow stream from a silent peer; clients ignore answers to requests they do not wait for.
package tcp
