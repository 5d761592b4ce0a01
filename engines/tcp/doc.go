// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package tcp is the universal fallback engine: it moves host memory between agents on different nodes over
// TCP (optionally TLS, e.g. the agents' mTLS), for pairs no faster engine claims. Over TLS 1.3, two engines that
// both offer the ALPN protocol "fxt-sealed/1" move their data after the hello in AES-GCM records of up to
// 256 KiB keyed from the session's exporter, instead of TLS's 16 KiB records (sealed.go); two that both offer
// "fxt-sealed/2" also send vectored requests of up to 8,192 parts instead of 1,024.
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
// Block batches are planned in block form (checked once) and expanded into segments when a plan is cut into
// requests.
//
// Claimed pairs: exactly one side on this node, the remote one reachable over TCP (its descriptor carries this
// engine's address), not both sides carrying RDMA keys (the rdma engine's pairs), and, where either side is GPU
// memory, no other engine claiming the pair (Options.Yield: fabric and rdma move GPU memory without staging).
// Host memory needs a view in this process; GPU memory needs a Stager.
//
// GPU memory is staged through pinned host memory. The engine loads no GPU runtime: Options.Stager, an interface
// this package declares, queues copies between a registered GPU region and a pinned host buffer (the agent wires
// engines/gpu/cudacopy's; tests use a fake over host memory). A GPU region the stager reaches gets this engine's
// address in its descriptor, so peers know they can reach it; one it does not is refused with the stager's
// reason. Staging memory is bounded per peer node and per side (Options.StagingBytes, 64 MiB by default, for this
// node's transfers to the peer and as much for serving the peer's requests), in 4 MiB slots allocated on first
// use and given back once a peer's slots went unused for 30 s, so pinned memory follows the active peers; a
// request touching GPU memory is at most one slot. Each staged chunk is one submission to the GPU (the
// scatter kernel gathers or scatters all of a vectored chunk's blocks, up to 8,192, in one launch; a contiguous
// chunk goes to the copy engine), never one copy per block; a chunk of whole blocks of one size goes to a stager
// that is also a StagedBlocks by block index, on both sides, without a segment per block. Writing from local GPU memory, a producer gathers
// chunk after chunk into slots while the connections send the ones already gathered, so the device-to-host copy
// of chunk i+1 overlaps the send of chunk i; a slot returns once its chunk is acknowledged. Reading into local
// GPU memory, chunks arrive into slots on every connection while a worker copies the arrived ones into the
// region. Serving a peer, the node receives a write's whole chunk into a slot before copying it into GPU
// memory (a peer lost mid-chunk leaves the region untouched), receives the next request while that copy runs,
// and answers the write once the copy finished; a read is gathered into a slot and answered from there, the
// next request's copy running while the answer leaves. Liveness, deadlines, cancellation and notifications are those of host transfers: once a
// transfer stops, no copy into its GPU region is queued any more, and it ends only after the copies already
// queued finished; a stopped write from GPU memory waits for the answers to the chunks already sent (at most the
// staging memory, or the liveness bound when the peer is gone), which the peer gives only once a chunk landed.
// Either way nothing of a staged transfer lands after Wait returns.
//
// Wire protocol, big-endian. Connection start: client "FXT1", its node name and the node it expects (u16
// length-prefixed); server "FXT1", status byte, its node name. Requests: op u8 (1 write, 2 read, 3 notify,
// 4 vectored write, 5 vectored read), reserved u8, id length u16, request id u64, offset u64, length u64,
// memory id; vectored requests then carry a u32 part count and (offset u64, length u32) per part; then the
// payload of writes and notifications. Responses: op u8, status u8 (0 ok), reserved u16, request id u64,
// length u64, then the data of reads or the error text. The server checks every range against the region
// before touching it, and answers a refused write only after consuming its payload, so the stream stays usable;
// a request for a staged GPU region larger than a staging slot (4 MiB) is refused the same way.
// While it receives a payload the server sends a keepalive (op 6, id 0, no data) at least every 100 ms, so a
// client tells a slow stream from a silent peer; clients ignore answers to requests they do not wait for.
package tcp
