// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestUsageIsKeptOnlyForCallersHoldingSomething: pods come and go on a node for months, and each one that
// registered, transferred or was refused left an entry in the agent's per-caller usage table. Forty pods each
// register, move bytes, get refused a region past the byte limit and leave; one more keeps a region. Only the
// one that holds something is left, its usage exactly what it holds.
func TestUsageIsKeptOnlyForCallersHoldingSomething(t *testing.T) {
	opts, proc := podOptions(t)
	opts.Limits = server.Limits{MaxRegions: 4, MaxRegisteredBytes: 1 << 20, MaxInFlight: 8, MaxItemsPerTransfer: 16}
	a := startAgent(t, opts)
	ctx := ctxT(t)
	m := shm(t, 4<<20)

	proc.setPod(t, "00000000-0000-4000-8000-00000000ffff")
	keeper := dial(t, a)
	kept, err := keeper.RegisterHost(ctx, m.File, 1<<20, 8192)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		proc.setPod(t, fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
		c := dial(t, a)
		src, err := c.RegisterHost(ctx, m.File, 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := c.RegisterHost(ctx, m.File, 4096, 4096)
		if err != nil {
			t.Fatal(err)
		}
		copy(m.Bytes[:4096], bytes.Repeat([]byte{byte(i + 1)}, 4096))
		if _, err := c.Write(ctx, src, 0, client.ToRegion(dst), 0, 4096); err != nil || !bytes.Equal(m.Bytes[4096:8192], m.Bytes[:4096]) {
			t.Fatalf("pod %d's transfer: %v", i, err)
		}
		if _, err := c.RegisterHost(ctx, m.File, 0, 2<<20); client.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "limit") {
			t.Fatalf("pod %d registering past the byte limit: %v, want ResourceExhausted", i, err)
		}
		if i%2 == 0 { // half deregister first, half leave it to the end of their connection
			if err := c.Deregister(ctx, src); err != nil {
				t.Fatal(err)
			}
			if err := c.Deregister(ctx, dst); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.srv.CallerEntries() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := a.srv.CallerEntries(); n != 1 {
		t.Fatalf("usage kept for %d callers after 40 pods left, want 1 (the pod still holding a region)", n)
	}
	info, err := keeper.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if u := info.Usage; u.Regions != 1 || u.RegisteredBytes != 8192 || u.InFlight != 0 {
		t.Fatalf("the remaining pod's usage: %v, want its one region of 8192 bytes", u)
	}
	if err := keeper.Deregister(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if n := a.srv.CallerEntries(); n != 0 {
		t.Fatalf("usage kept for %d callers once the last region went, want 0", n)
	}
}
