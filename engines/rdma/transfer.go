// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// statusError maps a failed completion to the error its plan reports.
func statusError(node string, qpn uint32, wc verbs.Completion) error {
	what := fmt.Sprintf("%s on queue pair %d to %s (vendor error %#x)", wc.Status, qpn, node, wc.VendorErr)
	switch wc.Status {
	case verbs.StatusRetryExcErr, verbs.StatusRNRRetryExc, verbs.StatusRespTimeout:
		return fmt.Errorf("%w: %s", engines.ErrPeerLost, what)
	case verbs.StatusRemAccessErr, verbs.StatusRemInvReqErr:
		return fmt.Errorf("%w: %s", ErrRemoteAccess, what)
	}
	return errors.New(what)
}

// Submit implements engines.Engine.
func (e *Engine) Submit(ctx context.Context, ps *engines.PlanSet, opts engines.SubmitOptions) (engines.Transfer, error) {
	var finalize func(context.Context, []engines.Outcome)
	if opts.Notify != nil {
		payload := append([]byte(nil), opts.Notify...)
		finalize = func(ctx context.Context, outcomes []engines.Outcome) { e.notifyAll(ctx, ps.Plans, outcomes, payload) }
	}
	t, work, err := e.reg.Begin(ctx, e.Name(), ps, opts, finalize)
	if err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	if len(work) > 0 {
		go e.run(t, work)
	}
	return t, nil
}

func (e *Engine) run(t *engines.Tracker, work []engines.Work) {
	engines.RunPlans(t, work, e.slots, func(ctx context.Context, w engines.Work) error {
		if err := e.executePlan(ctx, w); err != nil {
			return fmt.Errorf("rdma %s %s -> %s: %w", w.Plan.Direction, w.Plan.Src, w.Plan.Dst, err)
		}
		return nil
	})
}

// executePlan posts one work request per segment (the planner cut them at the
// chunk size) over the peer's queue pairs and waits for every completion.
// It returns only once the NIC reports nothing of this plan outstanding, or
// the queue pairs carrying it were torn down.
func (e *Engine) executePlan(ctx context.Context, w engines.Work) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	local, remote, op := w.Src, w.Dst, verbs.OpWrite
	if w.Plan.Direction == engines.DirRead {
		local, remote, op = w.Dst, w.Src, verbs.OpRead
	}
	e.mu.Lock()
	lm := e.local[local.ID]
	e.mu.Unlock()
	if lm == nil {
		return fmt.Errorf("%w: %s has no registration", engines.ErrUnknownMemory, local.ID)
	}
	if len(remote.Handles.RDMA) == 0 {
		return fmt.Errorf("%s has no RDMA key", remote.ID)
	}
	key := remote.Handles.RDMA[0]
	set, err := e.getSet(ctx, setKey{node: remote.Node, local: lm.nic.Device, remote: key.Device})
	if err != nil {
		return err
	}
	ch := make(chan verbs.Completion, len(w.Plan.Segments))
	posted := 0
	var firstErr error
	for _, s := range w.Plan.Segments {
		if err := ctx.Err(); err != nil {
			firstErr = err
			break
		}
		wr := verbs.WorkRequest{ID: e.wrIDs.Add(1), Op: op, LKey: lm.mr.LKey(), Length: uint32(s.Size), RKey: key.RKey}
		if op == verbs.OpWrite {
			wr.LocalAddr, wr.RemoteAddr = lm.addr+s.SrcOffset, key.Addr+s.DstOffset
		} else {
			wr.LocalAddr, wr.RemoteAddr = lm.addr+s.DstOffset, key.Addr+s.SrcOffset
		}
		if err := set.pick().post(ctx, wr, ch); err != nil {
			firstErr = err
			break
		}
		posted++
	}
	for received := 0; received < posted; received++ {
		var wc verbs.Completion
		select {
		case wc = <-ch:
		case <-ctx.Done():
			if firstErr == nil {
				firstErr = ctx.Err()
			}
			if err := e.drain(set, ch, posted-received); err != nil {
				return errors.Join(firstErr, err)
			}
			return firstErr
		}
		if wc.Status != verbs.StatusSuccess && firstErr == nil {
			firstErr = e.completionError(set, wc)
		}
	}
	return firstErr
}

// completionError explains a failed completion; a flush names the failure
// that put the queue pair into ERR.
func (e *Engine) completionError(set *qpSet, wc verbs.Completion) error {
	if wc.Status == verbs.StatusWRFlushErr {
		for _, c := range set.qps {
			c.mu.Lock()
			cause := c.failed
			c.mu.Unlock()
			if cause != nil {
				return fmt.Errorf("work flushed after %w", cause)
			}
		}
		return fmt.Errorf("work flushed: queue pairs to %s torn down", set.key.node)
	}
	return statusError(set.key.node, 0, wc)
}

// drain waits for n outstanding completions of a cancelled plan; when the NIC
// does not report them in time, the set's queue pairs are torn down, which
// flushes them.
func (e *Engine) drain(set *qpSet, ch <-chan verbs.Completion, n int) error {
	timer := time.NewTimer(e.opts.DrainTimeout)
	defer timer.Stop()
	for ; n > 0; n-- {
		select {
		case <-ch:
		case <-timer.C:
			set.broken.Store(true)
			for _, c := range set.qps {
				c.close()
			}
			for ; n > 0; n-- {
				select {
				case <-ch:
				case <-time.After(2 * time.Second):
					return fmt.Errorf("%d work requests to %s still unaccounted for after tearing down their queue pairs", n, set.key.node)
				}
			}
			return nil
		}
	}
	return nil
}

// notifyAll delivers a successful submission's notifications: writes to the
// remote node through the Notifier, reads to this node's handler. A
// notification that cannot be delivered fails its plans.
func (e *Engine) notifyAll(ctx context.Context, plans []engines.Plan, outcomes []engines.Outcome, payload []byte) {
	engines.NotifyDestinations(ctx, e.opts.Node, e.reg.Registry, plans, outcomes, payload, e.Deliver,
		func(ctx context.Context, node string, _ *engines.Plan, n engines.Notification) error {
			if e.opts.Notifier == nil {
				return errors.New("no channel to the destination node")
			}
			return e.opts.Notifier.SendNotification(ctx, node, n)
		})
}
