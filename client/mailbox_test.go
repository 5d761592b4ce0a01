// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestGoClientCallsThroughItsMailbox: the Go client's block transfers travel through its fast connection's
// mailbox when both sides poll, when the client sleeps and is woken (no spin), and when the agent sleeps and
// is rung (an agent that never polls); a long id list goes through the id arena and a short frame; a transfer
// of items too large for the mailbox goes on the socket, past the wake-ups earlier calls left there, and the
// mailbox carries the next call again; a submission without waiting and its wait both take the mailbox; calls
// from four goroutines at once each get their own reply. Every
// transfer's bytes are checked, and a client without a mailbox moves the same blocks.
func TestGoClientCallsThroughItsMailbox(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spin      time.Duration
		agentSpin time.Duration
	}{
		{"both poll", client.DefaultSpin, 0},
		{"the client sleeps", 0, 0},
		{"the agent sleeps", client.DefaultSpin, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, stop, err := runAgentWith(t.TempDir(), func(o *server.Options) { o.FastSpin = tc.agentSpin })
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, srv.SocketPath(), client.WithSpin(tc.spin))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			plain, err := client.Dial(ctx, srv.SocketPath(), client.WithoutMailbox())
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			if on, _ := client.MailboxRequests(plain); on {
				t.Fatal("a client dialled WithoutMailbox has a mailbox")
			}
			on, before := client.MailboxRequests(c)
			if !on {
				t.Fatal("the client's fast connection has no mailbox")
			}
			b := newBlockBed(t, ctx, c, 64, 16384)
			rng := rand.New(rand.NewPCG(3, 4))
			const calls = 150
			for i := range calls {
				b.move(t, ctx, c, rng, 1+rng.IntN(48), fmt.Sprintf("call %d", i))
			}
			if _, n := client.MailboxRequests(c); n-before != calls {
				t.Fatalf("%d of %d calls went through the mailbox", n-before, calls)
			}
			// 16,384 ids a side (128 KiB, more than the mailbox's area) go through the id arena.
			if !client.HasIDArena(c) {
				t.Fatal("the client's fast connection has no id arena")
			}
			b.move(t, ctx, c, rng, 16384, "a list through the id arena")
			if _, n := client.MailboxRequests(c); n-before != calls+1 {
				t.Fatal("a block list in the id arena did not go through the mailbox")
			}
			// 3,000 items (about 60 KiB of frame) do not fit the mailbox: the socket, past earlier wake-ups.
			b.items(t, ctx, c, rng, 3000, "items past the mailbox")
			if _, n := client.MailboxRequests(c); n-before != calls+1 {
				t.Fatal("a frame larger than the mailbox went through it")
			}
			b.move(t, ctx, c, rng, 3, "the call after the socket's")
			if _, n := client.MailboxRequests(c); n-before != calls+2 {
				t.Fatal("the call after a socket call did not go through the mailbox")
			}
			// Submitted without waiting, then waited for: both through the mailbox.
			clear(b.dstMem.Bytes)
			tr, err := c.SubmitBlocks(ctx, client.Write, b.srcL, []uint32{7}, client.ToLayout(b.dstL), []uint32{9}, client.TransferOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.dstMem.Bytes[9*64:10*64], b.srcMem.Bytes[7*64:8*64]) {
				t.Fatal("a submitted and waited block is not in place")
			}
			if _, n := client.MailboxRequests(c); n-before != calls+4 {
				t.Fatalf("a submission and its wait made %d mailbox calls, want 2", n-before-calls-2)
			}
			// Calls from several goroutines share the one connection and its mailbox, each its own destination
			// blocks: every call answered with its own reply, every block in place.
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			clear(b.dstMem.Bytes)
			for g := range 4 {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := range 50 {
						src, dst := uint32((g*50+i)*7%16384), uint32(g*4096+i)
						if _, err := c.TransferBlocks(ctx, client.Write, b.srcL, []uint32{src}, client.ToLayout(b.dstL), []uint32{dst}, client.TransferOptions{}); err != nil {
							errs <- fmt.Errorf("goroutine %d call %d: %w", g, i, err)
							return
						}
					}
				}(g)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for g := range 4 {
				for i := range 50 {
					s, d := (g*50+i)*7%16384*64, (g*4096+i)*64
					if !bytes.Equal(b.dstMem.Bytes[d:d+64], b.srcMem.Bytes[s:s+64]) {
						t.Fatalf("goroutine %d call %d: its destination block holds other bytes", g, i)
					}
				}
			}

			pb := newBlockBed(t, ctx, plain, 64, 1024)
			for i := range 20 {
				pb.move(t, ctx, plain, rng, 1+rng.IntN(48), fmt.Sprintf("socket call %d", i))
			}
		})
	}
}

// blockBed is a pair of host layouts of one region each, in shared memory this test reads.
type blockBed struct {
	bs             int
	srcMem, dstMem *client.SharedMemory
	src, dst       *client.Region
	srcL, dstL     *client.Layout
}

func newBlockBed(t *testing.T, ctx context.Context, c *client.Client, bs, blocks int) *blockBed {
	t.Helper()
	b := &blockBed{bs: bs}
	layout := func(name string) (*client.SharedMemory, *client.Region, *client.Layout) {
		mem, err := client.NewSharedMemory(name, uint64(bs*blocks))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		r, err := c.RegisterHost(ctx, mem.File, 0, uint64(bs*blocks))
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.RegisterLayout(ctx, []*client.Region{r}, uint64(bs))
		if err != nil {
			t.Fatal(err)
		}
		return mem, r, l
	}
	b.srcMem, b.src, b.srcL = layout("src")
	b.dstMem, b.dst, b.dstL = layout("dst")
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range b.srcMem.Bytes {
		b.srcMem.Bytes[i] = byte(rng.Uint32())
	}
	return b
}

// move writes n random source blocks to n distinct random destination blocks and checks each destination.
func (b *blockBed) move(t *testing.T, ctx context.Context, c *client.Client, rng *rand.Rand, n int, what string) {
	t.Helper()
	blocks := len(b.srcMem.Bytes) / b.bs
	src, dst := make([]uint32, n), make([]uint32, n)
	for i, d := range rng.Perm(blocks)[:n] {
		src[i], dst[i] = uint32(rng.IntN(blocks)), uint32(d)
	}
	clear(b.dstMem.Bytes)
	if _, err := c.TransferBlocks(ctx, client.Write, b.srcL, src, client.ToLayout(b.dstL), dst, client.TransferOptions{}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for i := range src {
		s, d := int(src[i])*b.bs, int(dst[i])*b.bs
		if !bytes.Equal(b.dstMem.Bytes[d:d+b.bs], b.srcMem.Bytes[s:s+b.bs]) {
			t.Fatalf("%s: destination block %d does not hold source block %d", what, dst[i], src[i])
		}
	}
}

// items moves n random source blocks to n distinct destination blocks as a transfer of n items (one frame of
// about 20 bytes an item) and checks each destination.
func (b *blockBed) items(t *testing.T, ctx context.Context, c *client.Client, rng *rand.Rand, n int, what string) {
	t.Helper()
	blocks := len(b.srcMem.Bytes) / b.bs
	clear(b.dstMem.Bytes)
	items := make([]client.Item, n)
	for i, d := range rng.Perm(blocks)[:n] {
		items[i] = client.Item{Local: b.src, LocalOffset: uint64(rng.IntN(blocks) * b.bs), Remote: client.ToRegion(b.dst),
			RemoteOffset: uint64(d * b.bs), Length: uint64(b.bs)}
	}
	if _, err := c.Do(ctx, client.Write, items, client.TransferOptions{}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, it := range items {
		s, d := it.LocalOffset, it.RemoteOffset
		if !bytes.Equal(b.dstMem.Bytes[d:d+uint64(b.bs)], b.srcMem.Bytes[s:s+uint64(b.bs)]) {
			t.Fatalf("%s: destination offset %d does not hold source offset %d", what, d, s)
		}
	}
}
