// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// Field numbers of agent.proto that block requests are written with directly (TestBlockWireFieldNumbers checks
// them against the descriptors, TestBlockFrameIsTheRequestOfTheArguments what is written against the message).
const (
	fastRequestBlocks      protowire.Number = 2 // FastRequest.blocks
	fastRequestCallTimeout protowire.Number = 6 // FastRequest.call_timeout

	blocksOp        protowire.Number = 1 // TransferBlocksRequest
	blocksLayoutID  protowire.Number = 2
	blocksRemote    protowire.Number = 3
	blocksLocalIDs  protowire.Number = 4
	blocksRemoteIDs protowire.Number = 5
	blocksIDBytes   protowire.Number = 6
	blocksTimeout   protowire.Number = 7
	blocksNotify    protowire.Number = 8
	blocksWait      protowire.Number = 9
	blocksArenaIDs  protowire.Number = 10

	layoutRefLayoutID protowire.Number = 1 // LayoutRef
	layoutRefSegment  protowire.Number = 2
	layoutRefNode     protowire.Number = 3
)

// blockRequest is a checked block transfer (newBlockRequest) as plain values. The fast socket's frame is written
// from it directly (appendFast): building and marshalling the TransferBlocksRequest cost a waited one-block call
// 13 allocations and about a microsecond on the development VM, more than the rest of the client's work; gRPC
// gets the message (message).
type blockRequest struct {
	op       agentv1.Op
	layoutID uint64
	// The other side: a layout of this client by id (byID), or one published under segment on node.
	byID          bool
	remoteID      uint64
	node, segment string
	timeout       time.Duration // none when not positive
	notify        []byte
	wait          bool
}

// newBlockRequest checks a block transfer's arguments and gives its request; the ids travel beside it.
func newBlockRequest(ctx context.Context, op Op, l *Layout, ids []uint32, remote RemoteLayout, remoteIDs []uint32, opts TransferOptions, wait bool) (blockRequest, error) {
	r := blockRequest{notify: opts.Notify, wait: wait, timeout: boundedTimeout(ctx, opts.Timeout, wait)}
	if l == nil {
		return r, status.Error(codes.InvalidArgument, "transferring blocks: no layout (nil)")
	}
	if err := opts.check(l.c.Info); err != nil {
		return r, fmt.Errorf("transferring blocks: %w", err)
	}
	if len(ids) != len(remoteIDs) {
		return r, status.Errorf(codes.InvalidArgument, "transferring blocks: %d local ids and %d remote ids", len(ids), len(remoteIDs))
	}
	var err error
	if r.layoutID, err = l.current(); err != nil {
		return r, err
	}
	switch {
	case remote.layout != nil:
		r.byID = true
		if r.remoteID, err = remote.layout.current(); err != nil {
			return r, fmt.Errorf("transferring blocks: %w", err)
		}
	case remote.segment == "":
		return r, status.Errorf(codes.InvalidArgument, "transferring blocks: remote layout names neither a layout nor a segment")
	case !utf8.ValidString(remote.segment) || !utf8.ValidString(remote.node):
		// Protobuf strings: the message would not marshal, and the frame must not carry what it refuses.
		return r, status.Errorf(codes.InvalidArgument, "transferring blocks: remote layout %q on node %q is not valid UTF-8", remote.segment, remote.node)
	default:
		r.node, r.segment = remote.node, remote.segment
	}
	switch op {
	case Write:
		r.op = agentv1.Op_OP_WRITE
	case Read:
		r.op = agentv1.Op_OP_READ
	default:
		return r, status.Errorf(codes.InvalidArgument, "unknown op %d", op)
	}
	return r, nil
}

// message is r as the TransferBlocksRequest gRPC sends, without its ids.
func (r *blockRequest) message() *agentv1.TransferBlocksRequest {
	req := &agentv1.TransferBlocksRequest{Op: r.op, LayoutId: r.layoutID, IdBytes: 4, Notify: r.notify, Wait: r.wait}
	if r.byID {
		req.Remote = &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: r.remoteID}}
	} else {
		req.Remote = &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: r.segment}, Node: r.node}
	}
	if r.timeout > 0 {
		req.Timeout = durationpb.New(r.timeout)
	}
	return req
}

// appendFast appends to b the FastRequest of r with its ids: in the frame, or arena ids in the connection's id
// arena (then ids and remoteIDs are not written).
func (r *blockRequest) appendFast(b []byte, ids, remoteIDs []uint32, arena uint32) []byte {
	ref := r.refSize()
	seconds, nanos := int64(r.timeout/time.Second), int32(r.timeout%time.Second)
	size := fastwire.UintSize(blocksOp, uint64(r.op)) + fastwire.UintSize(blocksLayoutID, r.layoutID) +
		protowire.SizeTag(blocksRemote) + protowire.SizeBytes(ref) + fastwire.UintSize(blocksIDBytes, 4) +
		fastwire.UintSize(blocksArenaIDs, uint64(arena))
	if arena == 0 {
		size += sizeBytes(blocksLocalIDs, 4*len(ids)) + sizeBytes(blocksRemoteIDs, 4*len(remoteIDs))
	}
	if r.timeout > 0 {
		size += protowire.SizeTag(blocksTimeout) + protowire.SizeBytes(fastwire.DurationSize(seconds, nanos))
	}
	size += sizeBytes(blocksNotify, len(r.notify))
	if r.wait {
		size += fastwire.UintSize(blocksWait, 1)
	}

	b = protowire.AppendVarint(protowire.AppendTag(b, fastRequestBlocks, protowire.BytesType), uint64(size))
	b = fastwire.AppendUint(b, blocksOp, uint64(r.op))
	b = fastwire.AppendUint(b, blocksLayoutID, r.layoutID)
	b = protowire.AppendVarint(protowire.AppendTag(b, blocksRemote, protowire.BytesType), uint64(ref))
	if r.byID {
		// A oneof member is written even when zero.
		b = protowire.AppendVarint(protowire.AppendTag(b, layoutRefLayoutID, protowire.VarintType), r.remoteID)
	} else {
		b = protowire.AppendString(protowire.AppendTag(b, layoutRefSegment, protowire.BytesType), r.segment)
		if r.node != "" {
			b = protowire.AppendString(protowire.AppendTag(b, layoutRefNode, protowire.BytesType), r.node)
		}
	}
	if arena == 0 {
		b = appendIDs(b, blocksLocalIDs, ids)
		b = appendIDs(b, blocksRemoteIDs, remoteIDs)
	}
	b = fastwire.AppendUint(b, blocksIDBytes, 4)
	if r.timeout > 0 {
		b = fastwire.AppendDuration(b, blocksTimeout, seconds, nanos)
	}
	if len(r.notify) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, blocksNotify, protowire.BytesType), r.notify)
	}
	if r.wait {
		b = fastwire.AppendUint(b, blocksWait, 1)
	}
	return fastwire.AppendUint(b, blocksArenaIDs, uint64(arena))
}

// refSize is the size of r's LayoutRef.
func (r *blockRequest) refSize() int {
	if r.byID {
		return protowire.SizeTag(layoutRefLayoutID) + protowire.SizeVarint(r.remoteID)
	}
	n := protowire.SizeTag(layoutRefSegment) + protowire.SizeBytes(len(r.segment))
	return n + sizeBytes(layoutRefNode, len(r.node))
}

// sizeBytes is the size of a bytes field of n bytes, left out when empty.
func sizeBytes(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// appendIDs writes ids as a bytes field of little-endian int32s (left out when there are none).
func appendIDs(b []byte, num protowire.Number, ids []uint32) []byte {
	if len(ids) == 0 {
		return b
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(4*len(ids)))
	n := len(b)
	b = append(b, make([]byte, 4*len(ids))...)
	putIDs(b[n:], ids)
	return b
}

// appendCallTimeout appends FastRequest.call_timeout to a fast frame b for a call bounded by ctx: fields of a
// message may come in any order.
func appendCallTimeout(ctx context.Context, b []byte) []byte {
	d := callTimeout(ctx)
	return fastwire.AppendDuration(b, fastRequestCallTimeout, int64(d/time.Second), int32(d%time.Second))
}
