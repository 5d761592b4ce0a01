// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"context"

	"github.com/fabricxfer/fabricxfer/engines"
)

// notifyAll sends a successful submission's notification to every destination node: peers over their
// connections, this node's handler directly (reads land here). A notification that cannot be delivered fails
// the plans writing to that node: the caller cannot count on the receiver knowing.
func (e *Engine) notifyAll(ctx context.Context, plans []engines.Plan, outcomes []engines.Outcome, payload []byte) {
	engines.NotifyDestinations(ctx, e.opts.Node, e.reg.Registry, plans, outcomes, payload, e.deliver,
		func(ctx context.Context, _ string, anyPlan *engines.Plan, n engines.Notification) error {
			return e.sendNotification(ctx, anyPlan, n)
		})
}

func (e *Engine) sendNotification(ctx context.Context, anyPlan *engines.Plan, n engines.Notification) error {
	d, _, err := e.reg.Lookup(anyPlan.Dst)
	if err != nil {
		return err
	}
	p, err := e.peerFor(ctx, d.Node, d.Handles.TCP)
	if err != nil {
		return err
	}
	result := make(chan error, 1)
	r := &request{op: opNotify, mem: d.ID, buf: encodeNotification(n), done: func(err error) { result <- err }}
	c := p.pick()
	if err := c.send(ctx, r); err != nil {
		return err
	}
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		c.cancel(r, ctx.Err())
		return <-result
	}
}
