// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestSettleReturnsOnceACutShortCallStopped: a waited block transfer whose context is cancelled while its host
// copy runs returns at once, and its copies went on landing after that (a connector that reused the blocks saw
// them overwritten). Settle returns once the agent stopped the transfer: the destination does not change after it.
// Through the mailbox and the socket frames, and with the call cancelled by another goroutine that settles at once;
// a client with nothing cut short settles at once.
func TestSettleReturnsOnceACutShortCallStopped(t *testing.T) {
	srv := startLocal(t)
	const block, blocks = 1 << 20, 192
	mem := sharedMemory(t, "settle", 2*blocks*block)
	for i := range blocks * block {
		mem.Bytes[i] = byte(i/block + 1)
	}
	src, dst := make([]uint32, blocks), make([]uint32, blocks)
	for i := range src {
		src[i], dst[i] = uint32(i), uint32(blocks+i)
	}
	for _, tc := range []struct {
		name string
		opts []client.Option
	}{{"mailbox", nil}, {"socket", []client.Option{client.WithoutMailbox()}}} {
		c, _ := dialLocal(t, srv, "settle-"+tc.name, tc.opts...)
		// Its own bound, not the dial's 20 s: a few seconds of copies here, which a loaded machine stretches.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.Settle(ctx); err != nil {
			t.Fatalf("%s: Settle with nothing cut short: %v", tc.name, err)
		}
		r, err := c.RegisterHost(ctx, mem.File, 0, 2*blocks*block)
		if err != nil {
			t.Fatal(err)
		}
		lay, err := c.RegisterLayout(ctx, []*client.Region{r}, block)
		if err != nil {
			t.Fatal(err)
		}
		cut := 0
		for try := 0; try < 6 && cut < 2; try++ {
			clear(mem.Bytes[blocks*block:])
			callCtx, cancel := context.WithCancel(ctx)
			time.AfterFunc(2*time.Millisecond, cancel)
			_, err := c.TransferBlocks(callCtx, client.Write, lay, src, client.ToLayout(lay), dst, client.TransferOptions{})
			cancel()
			if err == nil {
				continue // the copy beat the cancel: nothing was cut short
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s: a cancelled call: %v", tc.name, err)
			}
			cut++
			if err := c.Settle(ctx); err != nil {
				t.Fatalf("%s: Settle after a cut-short call: %v", tc.name, err)
			}
			seen := bytes.Clone(mem.Bytes[blocks*block:])
			time.Sleep(100 * time.Millisecond)
			if !bytes.Equal(seen, mem.Bytes[blocks*block:]) {
				t.Fatalf("%s: the destination changed after Settle returned", tc.name)
			}
		}
		if cut == 0 {
			t.Fatalf("%s: no call was cut short in 6 tries (the copy of %d MiB always beat a cancel at 2 ms)", tc.name, blocks)
		}
		// Cancelled by another goroutine, which settles at once, without waiting for the call to return: the
		// call may not have dropped its connection yet, nor its request have reached the agent.
		for try := range 10 {
			clear(mem.Bytes[blocks*block:])
			callCtx, cancel := context.WithCancel(ctx)
			returned := make(chan error, 1)
			go func() {
				_, err := c.TransferBlocks(callCtx, client.Write, lay, src, client.ToLayout(lay), dst, client.TransferOptions{})
				returned <- err
			}()
			time.Sleep(time.Duration(try*50) * time.Microsecond)
			cancel()
			if err := c.Settle(ctx); err != nil {
				t.Fatalf("%s: Settle beside a call another goroutine cancelled: %v", tc.name, err)
			}
			seen := bytes.Clone(mem.Bytes[blocks*block:])
			time.Sleep(50 * time.Millisecond)
			if !bytes.Equal(seen, mem.Bytes[blocks*block:]) {
				t.Fatalf("%s: the destination changed after Settle returned (cancelled %d µs in by another goroutine)", tc.name, try*50)
			}
			<-returned
		}
		// The client goes on: a waited call after the cut ones moves every byte.
		clear(mem.Bytes[blocks*block:])
		if _, err := c.TransferBlocks(ctx, client.Write, lay, src, client.ToLayout(lay), dst, client.TransferOptions{}); err != nil {
			t.Fatalf("%s: a call after the cut ones: %v", tc.name, err)
		}
		if !bytes.Equal(mem.Bytes[:blocks*block], mem.Bytes[blocks*block:]) {
			t.Fatalf("%s: a call after the cut ones did not copy every block", tc.name)
		}
		c.Close()
		if err := c.Settle(ctx); !errors.Is(err, client.ErrClosed) {
			t.Fatalf("%s: Settle on a closed client: %v, want ErrClosed", tc.name, err)
		}
	}
}
