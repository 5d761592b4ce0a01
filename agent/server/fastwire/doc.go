// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fastwire is the fast socket's wire format beside the framing of internal/sockio: block transfers read
// out of a FastRequest frame without copying their id lists into messages kept per connection (BlocksDecoder), packed block ids decoded and range
// checked in one pass (DecodeBlockIDs), a connection's id arena (IDArena, IDsFromArena), its mailbox of frames in
// shared memory (Mailbox) and replies.
//
// Everything here runs on the fast socket's request path, per request: it allocates only what a request carries
// beyond the usual (a notification, a published layout's name), takes no lock and starts no goroutine.
package fastwire
