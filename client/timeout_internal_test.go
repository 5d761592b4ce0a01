// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// TestBoundedTimeout: a waited transfer's timeout on the agent is the shorter of its own (zero: the agent's
// default) and what its context has left less a margin for the answer; a context with more time than that, or
// an unwaited transfer, changes nothing.
func TestBoundedTimeout(t *testing.T) {
	if agentDefaultTimeout != engines.DefaultTimeout {
		t.Fatalf("the client takes the agent's default timeout for %v, the engines' is %v", agentDefaultTimeout, engines.DefaultTimeout)
	}
	within := func(ctxLeft time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), ctxLeft)
		t.Cleanup(cancel)
		return ctx
	}
	near := func(got, want time.Duration) bool { return got <= want && got > want-50*time.Millisecond }
	if got := boundedTimeout(within(10*time.Minute), 0, true); got != 0 {
		t.Errorf("a 10-minute context, no timeout: %v, want 0 (the agent's default, shorter)", got)
	}
	if got := boundedTimeout(within(time.Second), 0, true); !near(got, 900*time.Millisecond) {
		t.Errorf("a 1 s context, no timeout: %v, want about 0.9 s", got)
	}
	if got := boundedTimeout(within(time.Second), 5*time.Second, true); !near(got, 900*time.Millisecond) {
		t.Errorf("a 1 s context, 5 s timeout: %v, want about 0.9 s", got)
	}
	if got := boundedTimeout(within(10*time.Second), 2*time.Second, true); got != 2*time.Second {
		t.Errorf("a 10 s context, 2 s timeout: %v, want 2 s", got)
	}
	if got := boundedTimeout(within(time.Second), 0, false); got != 0 {
		t.Errorf("an unwaited transfer: %v, want its own timeout (0)", got)
	}
	if got := boundedTimeout(context.Background(), 3*time.Second, true); got != 3*time.Second {
		t.Errorf("no deadline: %v, want 3 s", got)
	}
}

// TestTransferErrorNamesAFewFailures: the error of a transfer with thousands of failed items names the first
// few and how many more, not every one (Status keeps them all).
func TestTransferErrorNamesAFewFailures(t *testing.T) {
	st := &Status{TransferId: 7, State: agentv1.TransferState_TRANSFER_STATE_FAILED, Error: "deadline"}
	for i := range 8192 {
		st.Failures = append(st.Failures, &agentv1.TagFailure{Tag: fmt.Sprintf("item-%d", i), Code: "DEADLINE_EXCEEDED", Message: "ran out"})
	}
	msg := (&TransferError{Status: st}).Error()
	if len(msg) > 2048 || !strings.Contains(msg, "item-0:") || !strings.Contains(msg, "item-7:") ||
		strings.Contains(msg, "item-8:") || !strings.Contains(msg, "and 8184 more") {
		t.Fatalf("a transfer of 8,192 failed items: %d bytes: %.300s", len(msg), msg)
	}
}

// TestTransferErrorReadsAsItsState: Code and errors.Is read a transfer that ran out of time or was cancelled as
// the context errors and gRPC codes of those, and a failed one as its first failure's code.
func TestTransferErrorReadsAsItsState(t *testing.T) {
	wrapped := func(st *Status) error { return fmt.Errorf("transferring: %w", &TransferError{Status: st}) }
	deadline := wrapped(&Status{State: agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED})
	if Code(deadline) != codes.DeadlineExceeded || !errors.Is(deadline, context.DeadlineExceeded) || errors.Is(deadline, context.Canceled) {
		t.Errorf("a transfer past its deadline: code %v, Is(DeadlineExceeded) %v", Code(deadline), errors.Is(deadline, context.DeadlineExceeded))
	}
	cancelled := wrapped(&Status{State: agentv1.TransferState_TRANSFER_STATE_CANCELLED})
	if Code(cancelled) != codes.Canceled || !errors.Is(cancelled, context.Canceled) {
		t.Errorf("a cancelled transfer: code %v", Code(cancelled))
	}
	failed := wrapped(&Status{State: agentv1.TransferState_TRANSFER_STATE_FAILED,
		Failures: []*agentv1.TagFailure{{Tag: "a", Code: codes.OutOfRange.String()}, {Tag: "b", Code: "NotFound"}}})
	if Code(failed) != codes.OutOfRange || errors.Is(failed, context.DeadlineExceeded) {
		t.Errorf("a failed transfer: code %v", Code(failed))
	}
	if odd := wrapped(&Status{State: agentv1.TransferState_TRANSFER_STATE_FAILED, Failures: []*agentv1.TagFailure{{Code: "nonsense"}}}); Code(odd) != codes.Unknown {
		t.Errorf("a failure of an unknown code: %v", Code(odd))
	}
}
