// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// PreparedBlocks is a waited block transfer encoded once by PrepareBlocks, for a caller that repeats it as it is
// (a model's weights into the same memory each step, one fixed staging block). The agent checks it in full at
// every run, as it checks TransferBlocks.
type PreparedBlocks struct {
	c              *Client
	op             Op
	l              *Layout
	remote         RemoteLayout
	ids, remoteIDs []uint32 // the caller's, copied
	opts           TransferOptions
	// blocks is the encoded TransferBlocksRequest without its timeout (nil: Run goes through TransferBlocks);
	// each run appends the timeout its context allows and frames it as a FastRequest (protobuf readers take
	// fields in any order).
	blocks                    []byte
	blocksField, timeoutField protowire.Number
	gen                       uint64 // the session the layouts' ids belong to
	bytes                     uint64 // what a run moves
}

// PrepareBlocks encodes TransferBlocks(ctx, op, l, ids, remote, remoteIDs, opts) once; its Run moves the same
// blocks each time, with the timeout TransferBlocks would give them, and answers as TransferBlocks does. The ids
// are copied (changing the slices afterwards changes nothing).
func (c *Client) PrepareBlocks(op Op, l *Layout, ids []uint32, remote RemoteLayout, remoteIDs []uint32, opts TransferOptions) (*PreparedBlocks, error) {
	gen := c.generation()
	req, err := blocksRequest(context.Background(), op, l, ids, remote, remoteIDs, opts, true)
	if err != nil {
		return nil, fmt.Errorf("preparing blocks: %w", err)
	}
	p := &PreparedBlocks{c: c, op: op, l: l, remote: remote, ids: slices.Clone(ids), remoteIDs: slices.Clone(remoteIDs),
		opts: opts, gen: gen, bytes: l.bytesOf(len(ids)),
		blocksField:  (&agentv1.FastRequest{}).ProtoReflect().Descriptor().Fields().ByName("blocks").Number(),
		timeoutField: req.ProtoReflect().Descriptor().Fields().ByName("timeout").Number()}
	if len(ids) < arenaMinIDs { // longer lists go through the id arena, written at each call
		req.Timeout, req.LocalIds, req.RemoteIds = nil, packIDs(ids), packIDs(remoteIDs)
		if p.blocks, err = proto.Marshal(req); err != nil {
			return nil, fmt.Errorf("preparing blocks: %w", err)
		}
	}
	return p, nil
}

// Run moves the prepared blocks and waits, as TransferBlocks does.
func (p *PreparedBlocks) Run(ctx context.Context) (*Status, error) {
	c := p.c
	if p.blocks == nil || c.generation() != p.gen {
		return p.plain(ctx)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	resp, fast, err := c.fastPayload(ctx, p.payload(boundedTimeout(ctx, p.opts.Timeout, true)), c.spinFor(true, p.bytes))
	if !fast {
		return p.plain(ctx)
	}
	if err != nil {
		return nil, c.wrap("transferring blocks", p.gen, err)
	}
	return resp.Status, statusErr(resp.Status)
}

// plain runs the transfer as TransferBlocks, for what the kept frame cannot carry.
func (p *PreparedBlocks) plain(ctx context.Context) (*Status, error) {
	return p.c.TransferBlocks(ctx, p.op, p.l, p.ids, p.remote, p.remoteIDs, p.opts)
}

// payload is the FastRequest of one run: the prepared request with timeout (none when zero) appended.
func (p *PreparedBlocks) payload(timeout time.Duration) []byte {
	var dur []byte // a google.protobuf.Duration: seconds (field 1) and nanos (field 2), each left out when zero
	if timeout > 0 {
		if s := int64(timeout / time.Second); s != 0 {
			dur = protowire.AppendVarint(protowire.AppendTag(dur, 1, protowire.VarintType), uint64(s))
		}
		if n := int32(timeout % time.Second); n != 0 {
			dur = protowire.AppendVarint(protowire.AppendTag(dur, 2, protowire.VarintType), uint64(n))
		}
	}
	inner := len(p.blocks)
	if dur != nil {
		inner += protowire.SizeTag(p.timeoutField) + protowire.SizeBytes(len(dur))
	}
	b := make([]byte, 0, protowire.SizeTag(p.blocksField)+protowire.SizeBytes(inner))
	b = protowire.AppendVarint(protowire.AppendTag(b, p.blocksField, protowire.BytesType), uint64(inner))
	b = append(b, p.blocks...)
	if dur != nil {
		b = protowire.AppendBytes(protowire.AppendTag(b, p.timeoutField, protowire.BytesType), dur)
	}
	return b
}
