// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestSettleWaitsForTheCallersWaitedTransfers: Settle answers at once when nothing waited is in flight; while a
// waited transfer runs (a peer's data address that never answers, 30 s of timeout) it waits for it, its deadline
// bounding the wait (DEADLINE_EXCEEDED naming the transfer, which goes on); once that call is cut short, its
// transfer stops and Settle answers, having waited for it. An unwaited transfer is not waited for, nor another
// client's of the same caller.
func TestSettleWaitsForTheCallersWaitedTransfers(t *testing.T) {
	a := unreachablePeerAgent(t, 0)
	c := dial(t, a)
	settle := func(d time.Duration) (*agentv1.SettleResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return c.API().Settle(ctx, &agentv1.SettleRequest{})
	}
	if resp, err := settle(time.Second); err != nil || resp.Waited != 0 {
		t.Fatalf("Settle with nothing in flight: %v, %v", resp, err)
	}
	l, _ := hostLayout(t, c, rand.New(rand.NewPCG(23, 24)), 1, 4, 1024)
	// An unwaited transfer to the peer: Settle does not wait for it (Cancel does).
	tr, err := c.SubmitBlocks(ctxT(t), client.Write, l, []uint32{2}, client.ToLayoutSegment("node-z", "kv"), []uint32{2},
		client.TransferOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Cancel(ctxT(t))
	if resp, err := settle(time.Second); err != nil || resp.Waited != 0 {
		t.Fatalf("Settle beside an unwaited transfer: %v, %v", resp, err)
	}

	callCtx, cut := context.WithCancel(ctxT(t))
	defer cut()
	called := make(chan error, 1)
	go func() {
		_, err := c.TransferBlocks(callCtx, client.Write, l, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{3},
			client.TransferOptions{Timeout: 30 * time.Second})
		called <- err
	}()
	var resp *agentv1.SettleResponse
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err = settle(200 * time.Millisecond)
		if err != nil || time.Now().After(deadline) {
			break
		}
	}
	if client.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "still in flight") {
		t.Fatalf("Settle beside a waited transfer that does not end: %v, %v; want DEADLINE_EXCEEDED naming it", resp, err)
	}
	// Another client of the same caller (another worker of the pod) is not held by it.
	other := dial(t, a)
	octx, ocancel := context.WithTimeout(context.Background(), time.Second)
	resp, err = other.API().Settle(octx, &agentv1.SettleRequest{})
	ocancel()
	if err != nil || resp.Waited != 0 {
		t.Fatalf("another client's Settle beside this one's waited transfer: %v, %v; want nothing waited for", resp, err)
	}
	done := make(chan struct{})
	var settled *agentv1.SettleResponse
	var serr error
	go func() {
		defer close(done)
		settled, serr = settle(10 * time.Second)
	}()
	time.Sleep(50 * time.Millisecond)
	cut()
	if err := <-called; err == nil {
		t.Fatal("a waited call cut short succeeded")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Settle still waiting 5 s after the waited call was cut short")
	}
	if serr != nil || settled.Waited != 1 {
		t.Fatalf("Settle after the waited call was cut short: %v, %v; want 1 waited for", settled, serr)
	}
}
