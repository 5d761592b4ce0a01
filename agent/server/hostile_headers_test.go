// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/metadata"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// TestGiantHeaderBlocksAreNotHeld: connections that each send a header block of 8 MiB and never finish it (no
// call exists yet, so no call limit counts them) leave the agent's memory as it was; a call with 1 MiB of
// metadata is refused; the agent goes on answering. gRPC's own bound, 16 MiB a block, let 128 connections of one
// process hold 2 GiB of the agent's memory.
func TestGiantHeaderBlocksAreNotHeld(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/fabricxfer.agent.v1.Agent/GetInfo"},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 32 { // distinct 256 KiB values, stored as they are (no index, no Huffman gain)
		v := bytes.Repeat([]byte{byte('a' + i%26)}, 256<<10)
		if err := enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", i), Value: string(v), Sensitive: true}); err != nil {
			t.Fatal(err)
		}
	}
	frag := block.Bytes()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const conns, chunk = 6, 16 << 10
	sent := 0
	for range conns {
		conn, err := net.Dial("unix", a.srv.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
			t.Fatal(err)
		}
		fr := http2.NewFramer(conn, conn)
		if fr.WriteSettings() != nil || fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: frag[:chunk]}) != nil {
			continue // the agent closed it: nothing held
		}
		off := chunk
		for ; off+chunk < len(frag); off += chunk { // the last fragment is never sent: the block stays open
			if fr.WriteContinuation(1, false, frag[off:off+chunk]) != nil {
				break // the agent refused the block and closed the connection
			}
		}
		sent += off
	}
	time.Sleep(200 * time.Millisecond) // what was written is read
	if grown := int64(heap()) - int64(before); grown > 16<<20 {
		t.Fatalf("%d connections sending %d MiB of unfinished headers grew the agent's heap by %d MiB", conns, sent>>20, grown>>20)
	}
	// A call whose metadata passes the bound is refused, and the agent goes on answering.
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "x-big", strings.Repeat("x", 1<<20))
	if _, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); err == nil {
		t.Fatal("a call with 1 MiB of metadata was served")
	}
	if _, err := c.API().GetInfo(ctxT(t), &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("after the giant header blocks: %v", err)
	}
}
