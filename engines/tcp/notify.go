package tcp

import (
	"context"
	"fmt"
	"slices"

	"github.com/fabricxfer/fabricxfer/engines"
)

// notifyAll sends a successful submission's notification to every destination node: peers over their
// connections, this node's handler directly (reads land here). A notification that cannot be delivered fails
// the plans writing to that node: the caller cannot count on the receiver knowing.
func (e *Engine) notifyAll(ctx context.Context, plans []engines.Plan, outcomes []engines.Outcome, payload []byte) {
	if !engines.AllSucceeded(outcomes) || len(plans) == 0 {
		return
	}
	byNode := map[string][]int{}
	var nodes []string
	for i := range plans {
		node := e.opts.Node
		if plans[i].Direction == engines.DirWrite {
			d, _, err := e.reg.Lookup(plans[i].Dst)
			if err != nil {
				outcomes[i].Err = fmt.Errorf("notifying: %w", err)
				continue
			}
			node = d.Node
		}
		if _, ok := byNode[node]; !ok {
			nodes = append(nodes, node)
		}
		byNode[node] = append(byNode[node], i)
	}
	slices.Sort(nodes)
	for _, node := range nodes {
		idx := byNode[node]
		ptrs := make([]*engines.Plan, len(idx))
		for k, i := range idx {
			ptrs[k] = &plans[i]
		}
		n := engines.BuildNotification(e.opts.Node, ptrs, payload)
		if node == e.opts.Node {
			e.deliver(n)
			continue
		}
		if err := e.sendNotification(ctx, &plans[idx[0]], n); err != nil {
			for _, i := range idx {
				outcomes[i].Err = fmt.Errorf("data landed but the notification to %s failed: %w", node, err)
			}
		}
	}
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
