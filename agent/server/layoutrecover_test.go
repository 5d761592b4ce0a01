// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestRecoverRegistersLayoutsAgain: after the agent restarts, the Go client's Recover registers its layouts
// again with their regions, as the Python client's does, so a caller that retries after Recover moves blocks
// through the layouts it holds (by object and by published name); a layout over a pool slice, which went with
// the agent, fails with ErrLost instead of ErrSessionLost, so a "Recover and retry" loop ends.
func TestRecoverRegistersLayoutsAgain(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Pool = newHostPool(t, 4<<20)
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(29, 30))
	const bs, blocks = 256, 8
	src, srcMem := hostLayout(t, c, rng, 2, blocks, bs, client.PublishLayout("kv-src"))
	dst, dstMem := hostLayout(t, c, rng, 2, blocks, bs)
	slice, err := c.AllocateFromPool(ctx, bs*blocks)
	if err != nil {
		t.Fatal(err)
	}
	onPool, err := c.RegisterLayout(ctx, []*client.Region{slice.Region}, bs)
	if err != nil {
		t.Fatal(err)
	}
	oldID := src.ID()

	a.stop(t)
	startAgent(t, opts)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = c.TransferBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
		if errors.Is(err, client.ErrSessionLost) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a block transfer after the restart: %v, want ErrSessionLost", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 2 { // a second Recover on the recovered session registers nothing twice
		if err := c.Recover(ctx); err != nil {
			t.Fatalf("Recover: %v", err)
		}
	}
	if src.ID() == oldID {
		t.Errorf("layout id %d survived the restart", oldID)
	}
	if _, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1, 3}, client.ToLayout(dst), []uint32{2, 7}, client.TransferOptions{}); err != nil {
		t.Fatalf("a block transfer through the recovered layouts: %v", err)
	}
	if _, err := c.TransferBlocks(ctx, client.Read, dst, []uint32{0}, client.ToLayoutSegment("", "kv-src"), []uint32{5}, client.TransferOptions{}); err != nil {
		t.Fatalf("reading the recovered layout by its published name: %v", err)
	}
	for k := range srcMem {
		s, d := srcMem[k].Bytes, dstMem[k].Bytes
		for _, p := range [][2]int{{1, 2}, {3, 7}, {5, 0}} {
			if !bytes.Equal(s[p[0]*bs:(p[0]+1)*bs], d[p[1]*bs:(p[1]+1)*bs]) {
				t.Fatalf("region %d: block %d of the destination is not block %d of the source", k, p[1], p[0])
			}
		}
	}
	_, err = c.TransferBlocks(ctx, client.Write, onPool, []uint32{0}, client.ToLayout(dst), []uint32{0}, client.TransferOptions{})
	if !errors.Is(err, client.ErrLost) || errors.Is(err, client.ErrSessionLost) {
		t.Fatalf("a layout over a pool slice after the restart: %v, want ErrLost (not ErrSessionLost)", err)
	}
	if _, err := c.TransferBlocks(ctx, client.Write, nil, []uint32{0}, client.ToLayout(dst), []uint32{0}, client.TransferOptions{}); err == nil {
		t.Fatal("a block transfer of a nil layout succeeded")
	}
}

// TestARecoverThatFailedIsRetried: a Recover that could not register a region (its published name was taken
// in the new agent by another client meanwhile) is tried again by the next Recover, which registers the region
// and the layout over it once the name is free; the second Recover found the session to be the one it had
// recovered and registered nothing, leaving the region lost for good.
func TestARecoverThatFailedIsRetried(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	src, dst := shm(t, 8192), shm(t, 8192)
	fill(t, src.Bytes)
	rs, err := c.RegisterHost(ctx, src.File, 0, 8192, client.Segment("x"))
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := c.RegisterLayout(ctx, []*client.Region{rs}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := c.RegisterLayout(ctx, []*client.Region{rd}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	b := startAgent(t, opts)
	// A Recover that fails for what a retry mends (the descriptor socket not there yet) leaves the calls'
	// ErrSessionLost, so a "Recover and retry" loop goes on.
	fdSock := b.srv.FDSocketPath()
	if err := os.Rename(fdSock, fdSock+".away"); err != nil {
		t.Fatal(err)
	}
	if err := c.Recover(ctx); err == nil {
		t.Fatal("Recover without the descriptor socket succeeded")
	}
	if err := os.Rename(fdSock+".away", fdSock); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096); !errors.Is(err, client.ErrSessionLost) {
		t.Fatalf("a write through a region a Recover could not register for a missing socket: %v, want ErrSessionLost", err)
	}
	squatter := dial(t, b)
	taken, err := squatter.RegisterHost(ctx, shm(t, 4096).File, 0, 4096, client.Segment("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Recover(ctx); client.Code(err) != codes.AlreadyExists {
		t.Fatalf("Recover while another client holds the region's name: %v, want AlreadyExists", err)
	}
	// Until then the region's and the layout's calls say why, not ErrSessionLost: a "Recover and retry" loop
	// went on for good.
	_, err = c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096)
	_, lerr := c.TransferBlocks(ctx, client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{1}, client.TransferOptions{})
	for what, err := range map[string]error{"a write through the region": err, "a block transfer through the layout": lerr} {
		if client.Code(err) != codes.AlreadyExists || errors.Is(err, client.ErrSessionLost) || !strings.Contains(err.Error(), "not registered again") {
			t.Errorf("%s Recover could not register again: %v, want AlreadyExists saying so, not ErrSessionLost", what, err)
		}
	}
	if err := squatter.Deregister(ctx, taken); err != nil {
		t.Fatal(err)
	}
	if err := c.Recover(ctx); err != nil {
		t.Fatalf("Recover once the name is free: %v", err)
	}
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096); err != nil {
		t.Fatalf("a write through the region the second Recover registered: %v", err)
	}
	if _, err := c.TransferBlocks(ctx, client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{1}, client.TransferOptions{}); err != nil {
		t.Fatalf("a block transfer through the layout over it: %v", err)
	}
	if !bytes.Equal(dst.Bytes, src.Bytes) {
		t.Fatal("the destination does not hold the source's bytes")
	}
}
