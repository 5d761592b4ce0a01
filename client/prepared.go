// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"fmt"
	"slices"
)

// PreparedBlocks is a waited block transfer checked once by PrepareBlocks, for a caller that repeats it as it is
// (a model's weights into the same memory each step, one fixed staging block). The agent checks it in full at
// every run, as it checks TransferBlocks.
type PreparedBlocks struct {
	c              *Client
	op             Op
	l              *Layout
	remote         RemoteLayout
	ids, remoteIDs []uint32 // the caller's, copied
	opts           TransferOptions
	req            blockRequest // with the layouts' ids of session gen; each run sets its timeout
	gen            uint64
	bytes          uint64 // what a run moves
}

// PrepareBlocks packs TransferBlocks(ctx, op, l, ids, remote, remoteIDs, opts) once, checking what the client
// can (the id counts, the options); its Run moves the same blocks each time, with the timeout TransferBlocks
// would give them, and answers as TransferBlocks does, the agent's refusals included (ids out of range, a
// remote layout not published). The ids and the notification are copied (changing the slices afterwards changes
// nothing).
func (c *Client) PrepareBlocks(op Op, l *Layout, ids []uint32, remote RemoteLayout, remoteIDs []uint32, opts TransferOptions) (*PreparedBlocks, error) {
	gen := c.generation()
	if c.closed.Load() {
		return nil, fmt.Errorf("preparing blocks: %w", ErrClosed)
	}
	if err := c.checkBlockCount(len(ids)); err != nil {
		return nil, err
	}
	req, err := newBlockRequest(context.Background(), op, l, ids, remote, remoteIDs, opts, true)
	if err != nil {
		return nil, fmt.Errorf("preparing blocks: %w", err)
	}
	req.notify = slices.Clone(req.notify) // as the ids: what was prepared is what runs
	opts.Notify = req.notify              // plain runs from opts: the copy, not the caller's slice
	return &PreparedBlocks{c: c, op: op, l: l, remote: remote, ids: slices.Clone(ids), remoteIDs: slices.Clone(remoteIDs),
		opts: opts, req: req, gen: gen, bytes: l.bytesOf(len(ids))}, nil
}

// Run moves the prepared blocks and waits, as TransferBlocks does.
func (p *PreparedBlocks) Run(ctx context.Context) (*Status, error) {
	c := p.c
	if c.generation() != p.gen {
		return p.plain(ctx)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("transferring blocks: nothing sent: %w", err)
	}
	r := p.req
	r.timeout = boundedTimeout(ctx, p.opts.Timeout, true)
	defer c.waited.leave(c.waited.enter())
	resp, fast, err := c.fastBlocks(ctx, &r, p.ids, p.remoteIDs, p.bytes)
	if !fast {
		// No fast connection, or another call held it: through gRPC from the packed request (TransferBlocks
		// would check the arguments again, and wait for a held connection a second time).
		resp, err = c.grpcBlocks(ctx, &r, p.ids, p.remoteIDs)
	}
	if err != nil {
		return nil, c.wrap(ctx, "transferring blocks", p.gen, err)
	}
	return resp.Status, statusErr(resp.Status)
}

// plain runs the transfer as TransferBlocks, for a session recovered since (the packed request names the layouts'
// old ids).
func (p *PreparedBlocks) plain(ctx context.Context) (*Status, error) {
	return p.c.TransferBlocks(ctx, p.op, p.l, p.ids, p.remote, p.remoteIDs, p.opts)
}
