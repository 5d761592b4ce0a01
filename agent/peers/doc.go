// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package peers is the agent-to-agent channel of one pool: the fabricxfer.agent.v1 Peer gRPC service over TCP,
// authenticated both ways with the pool's certificates (mTLS), for segment resolution, the confirmation of
// descriptors callers hand an agent ([Peers.ConfirmDescriptor]), agent introductions and notifications of
// engines that have no wire of their own, and the rdma engine's queue-pair exchange
// ([Peers.ExchangeQPs] is its rdma.Exchanger; the receiving agent hands the request to its [QPAcceptor]). Bulk
// bytes do not travel here: the tcp engine carries them on its own listener, with the same TLS configuration
// ([TLSFiles.Config]), and the rdma engine on its queue pairs.
//
// Peers are found through a [Directory] (TransferNode .status.endpoint through the API server, or a static
// list for the demo) and connected as soon as they appear, so the first transfer does not pay the handshake.
// That holds for the data path too: an agent's Hello answer names its tcp engine's address (header
// fabricxfer-data-endpoint), and the [DataPath] opens its connections there at once; a peer that leaves the
// directory loses both. Failures are logged and retried at every refresh.
// Certificates come from a directory holding tls.crt, tls.key and ca.crt (the pool's Secret, mounted); they
// are re-read when the files change, and ca.crt may hold two CAs during a rotation.
package peers
