// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package transfers serves the Agent API's transfer calls over a region table: Transfer (items between
// regions, segments and descriptors), TransferBlocks (numbered blocks of two layouts, the fast socket's hot
// path), Wait, Cancel, Watch, Notifications, ResolveSegment and Explain, and it answers notifications the engines
// and other agents deliver.
//
// A transfer is checked whole before anything moves, charged to its caller's in-flight limits, submitted to the
// engines and recorded until it settles and some time after, for Wait. Other nodes' memory is imported into the
// engines when a transfer first names it and kept for reuse (bounded, least recently used evicted); other nodes'
// published layouts are cached for a short while.
//
// TransferBlocks and the submission behind it run per request on the fast socket and are latency-bound: a change
// that adds an allocation, a lock, a goroutine or an interface call per request there is measured first.
package transfers
