// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrInvalid: the input is malformed (bad descriptor, duplicate id, oversized payload, ...).
	ErrInvalid = errors.New("invalid argument")
	// ErrUnknownMemory: the region is not registered (never was, or was deregistered).
	ErrUnknownMemory = errors.New("unknown or deregistered memory")
	// ErrOutOfBounds: an item's range does not fit in its region.
	ErrOutOfBounds = errors.New("range out of bounds")
	// ErrOverlap: an item's destination range overlaps another accepted item's in the same batch.
	ErrOverlap = errors.New("destination range overlaps another item")
	// ErrUnplannable: no engine moves bytes between the pair.
	ErrUnplannable = errors.New("no engine can move this pair")
	// ErrPeerLost: the node at the other end stopped answering or closed the connection.
	ErrPeerLost = errors.New("peer lost")
	// ErrDeadline: the transfer ran past its deadline. Errors wrapping it also match context.DeadlineExceeded.
	ErrDeadline = errors.New("transfer deadline exceeded")
	// ErrCancelled: the transfer was cancelled. Errors wrapping it also match context.Canceled.
	ErrCancelled = errors.New("transfer cancelled")
	// ErrDeregistered: a region the transfer used was deregistered while it was in flight.
	ErrDeregistered = errors.New("memory deregistered during transfer")
	// ErrBusy: a region is still in use by a copy that did not stop within the grace period.
	ErrBusy = errors.New("memory still in use")
	// ErrClosed: the engine is closed.
	ErrClosed = errors.New("engine closed")
	// ErrForeignPlan: the plan set was built by another engine.
	ErrForeignPlan = errors.New("plan set built by another engine")
)

// deadlineError and cancelledError match both the package sentinel and the context error.
var (
	errDeadline  = fmt.Errorf("%w (%w)", ErrDeadline, context.DeadlineExceeded)
	errCancelled = fmt.Errorf("%w (%w)", ErrCancelled, context.Canceled)
)

// ItemError rejects one item at planning.
type ItemError struct {
	Item Item
	Err  error
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("item tag %d (%s+%d -> %s+%d, %d bytes): %v",
		e.Item.Tag, e.Item.Src, e.Item.SrcOffset, e.Item.Dst, e.Item.DstOffset, e.Item.Size, e.Err)
}

func (e *ItemError) Unwrap() error { return e.Err }

// Refusal is one engine's reason for not claiming a pair.
type Refusal struct {
	Engine string
	Reason string
}

// UnplannableError says that no engine claims a pair, with every engine's reason.
type UnplannableError struct {
	Src, Dst MemoryID
	Refusals []Refusal
}

func (e *UnplannableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %s -> %s", ErrUnplannable, e.Src, e.Dst)
	for i, r := range e.Refusals {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", r.Engine, r.Reason)
	}
	return b.String()
}

func (e *UnplannableError) Is(target error) bool { return target == ErrUnplannable }

// PeerLostError fails transfers to or from a peer that went away. Peer names the node (and its address).
type PeerLostError struct {
	Peer string
	Err  error
}

func (e *PeerLostError) Error() string {
	return fmt.Sprintf("peer %s lost: %v", e.Peer, e.Err)
}

func (e *PeerLostError) Is(target error) bool { return target == ErrPeerLost }
func (e *PeerLostError) Unwrap() error        { return e.Err }

// Failure is one failed plan, mapped back to the caller's tags.
type Failure struct {
	Engine string
	// Plan is the plan's index in the PlanSet.
	Plan int
	Src  MemoryID
	Dst  MemoryID
	Tags []Tag
	Err  error
}

// TransferError lists every failed plan of a transfer. errors.Is matches any failure's error.
type TransferError struct {
	Failures []Failure
}

func (e *TransferError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d plan(s) failed", len(e.Failures))
	for i, f := range e.Failures {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(e.Failures)-i)
			break
		}
		fmt.Fprintf(&b, "; %s plan %d %s -> %s (%d tags): %v", f.Engine, f.Plan, f.Src, f.Dst, len(f.Tags), f.Err)
	}
	return b.String()
}

func (e *TransferError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// FailedTags returns the tags of every failed plan, in plan order.
func (e *TransferError) FailedTags() []Tag {
	var tags []Tag
	for _, f := range e.Failures {
		tags = append(tags, f.Tags...)
	}
	return tags
}
