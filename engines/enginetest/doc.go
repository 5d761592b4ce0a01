// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package enginetest is the contract suite every engine runs against itself: planning rules (unknown,
// deregistered and out-of-bounds items rejected with their tags, empty items dropped, every accepted item in
// exactly one plan, coalescing, deterministic order, splitting at limits), data correctness in each direction
// the engine serves, idempotent Wait, failures mapped to tags, cancellation, deadlines, deregistration while a
// transfer is in flight, and target-side notifications.
//
// An engine's test builds a [Harness] (how to make a pair of regions it serves, how to stall its data path)
// and calls [Run].
package enginetest
