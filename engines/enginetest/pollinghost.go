// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package enginetest

import (
	"context"
	"sync/atomic"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// PollingHost is the xgmi host backend posing as a BlockCopier whose copies end after a number of polls, as a
// GPU copy is seen done by polling its done word: it copies at start, then Poll reports done on the Polls-th
// call, with the failure SetFail gave as the copy's outcome. While Gate is shut a copy runs on: polls report it
// running and a blocking wait waits for the gate. It counts polls and blocking waits. A waited transfer through
// it is driven by its waiter, as a GPU copy is.
type PollingHost struct {
	*xgmi.HostBackend
	Polls       int64
	Gate        *Gate
	fail        atomic.Pointer[error]
	Polled, Ran atomic.Int64
}

// NewPollingHost is a host backend whose copies end on their polls-th poll, behind an open gate.
func NewPollingHost(polls int64) *PollingHost {
	return &PollingHost{HostBackend: xgmi.NewHostBackend(), Polls: polls, Gate: &Gate{}}
}

// SetFail makes the copies started from now on end with err (nil: succeed).
func (h *PollingHost) SetFail(err error) { h.fail.Store(&err) }

// StartBlocks copies the works, then reports them done on the Polls-th poll.
func (h *PollingHost) StartBlocks(ctx context.Context, works []engines.Work) (xgmi.Started, error) {
	for _, w := range works {
		if err := h.HostBackend.Copy(ctx, w); err != nil {
			return xgmi.Started{}, err
		}
	}
	var fail error
	if p := h.fail.Load(); p != nil {
		fail = *p
	}
	var n atomic.Int64
	return xgmi.Started{
		Wait: func(ctx context.Context) error {
			h.Ran.Add(1)
			if err := h.Gate.Wait(ctx); err != nil {
				return err
			}
			return fail
		},
		Poll: func() (bool, error) {
			h.Polled.Add(1)
			if n.Add(1) < h.Polls || h.Gate.shutNow() {
				return false, nil
			}
			return true, fail
		},
	}, nil
}
