// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestOutOfRangeBlockIDsAreRefusedInTheCallersWords: a block id outside the layout — negative (an int32 -1
// reads as 4294967295), just past the last block, or far past it (an int64 id of 2^32+5 would narrow to block 5)
// — is refused before anything moves, whatever the id width (4 or 8 bytes) and whatever the path (gRPC, waited
// or not; a fast socket frame; the mailbox; the connection's id arena; the Go client), with one clear
// InvalidArgument naming the side, the id as sent, its entry and the layout's block count; never a planner's
// "ends outside vm/…; xgmi plan 0" (what 4-byte and arena ids got before). int64 ids are refused as they are
// decoded, int32 ids when the engines refuse the plan. In-range calls on every path still move exactly their
// blocks.
func TestOutOfRangeBlockIDsAreRefusedInTheCallersWords(t *testing.T) {
	const bs, blocks = 64, 4096
	b := newFastBlocksBed(t, 21, blocks, bs)
	a, c, ctx := b.a, b.c, b.ctx
	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	arena := shm(t, 1<<20)
	if r := rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_IdArena{
		IdArena: &agentv1.IdArena{FdToken: b.put(arena.File), Size: 1 << 20}}})); r.Code != 0 {
		t.Fatalf("setting the id arena: %v", r)
	}
	mb := attachMailbox(t, a, c, 64<<10)

	pack := func(width int, ids []uint64) []byte {
		out := make([]byte, width*len(ids))
		for i, v := range ids {
			if width == 4 {
				binary.LittleEndian.PutUint32(out[4*i:], uint32(v))
			} else {
				binary.LittleEndian.PutUint64(out[8*i:], v)
			}
		}
		return out
	}
	request := func(width int, local, remote []uint64, wait bool) *agentv1.TransferBlocksRequest {
		return &agentv1.TransferBlocksRequest{Op: agentv1.Op_OP_WRITE, LayoutId: b.src.ID(),
			Remote:  &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: b.dst.ID()}},
			IdBytes: uint32(width), LocalIds: pack(width, local), RemoteIds: pack(width, remote), Wait: wait}
	}
	frame := func(req *agentv1.TransferBlocksRequest) []byte {
		return fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: req}})
	}
	// Each path sends one block transfer and answers the refusal's code and words (codes.OK: none).
	type answer struct {
		code codes.Code
		msg  string
	}
	fromErr := func(err error) answer {
		if err == nil {
			return answer{codes.OK, ""}
		}
		return answer{client.Code(err), err.Error()}
	}
	fromReply := func(r *agentv1.FastReply) answer {
		if r.Code == 0 && r.Response.GetStatus() != nil && r.Response.Status.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			return answer{codes.Unknown, r.Response.Status.String()}
		}
		return answer{codes.Code(r.Code), r.Message}
	}
	paths := map[string]func(width int, local, remote []uint64) answer{
		"gRPC": func(width int, local, remote []uint64) answer {
			resp, err := c.API().TransferBlocks(ctx, request(width, local, remote, true))
			if err == nil && resp.Status.GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
				return answer{codes.Unknown, resp.Status.String()}
			}
			return fromErr(err)
		},
		"gRPC, not waited": func(width int, local, remote []uint64) answer {
			resp, err := c.API().TransferBlocks(ctx, request(width, local, remote, false))
			if err == nil {
				st, werr := c.API().Wait(ctx, &agentv1.WaitRequest{TransferId: resp.TransferId})
				if werr != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
					return answer{codes.Unknown, fmt.Sprintf("submitted as transfer %d, which ended %v %v", resp.TransferId, st, werr)}
				}
			}
			return fromErr(err)
		},
		"fast socket frame": func(width int, local, remote []uint64) answer {
			return fromReply(rawFrame(t, conn, frame(request(width, local, remote, true))))
		},
		"mailbox": func(width int, local, remote []uint64) answer {
			return fromReply(mb.call(frame(request(width, local, remote, true))))
		},
		"id arena": func(width int, local, remote []uint64) answer {
			n := len(local)
			copy(arena.Bytes, pack(width, local))
			copy(arena.Bytes[width*n:], pack(width, remote))
			req := request(width, nil, nil, true)
			req.ArenaIds = uint32(n)
			return fromReply(rawFrame(t, conn, frame(req)))
		},
	}

	// The bad ids, each as the refusal shows it.
	type bad struct {
		v     uint64
		shown string
	}
	minus1 := uint64(math.MaxUint64) // -1, as an int64; its low 32 bits are int32 -1
	bads := map[int][]bad{
		4: {{minus1, "4294967295 (-1 as int32)"}, {blocks, "4096"}, {1 << 31, "2147483648 (-2147483648 as int32)"}},
		8: {{minus1, "-1"}, {blocks, "4096"}, {1<<32 + 5, "4294967301"}, {1 << 40, "1099511627776"}},
	}
	before := b.snapshot()
	for name, send := range paths {
		for _, width := range []int{4, 8} {
			for _, side := range []string{"local", "remote"} {
				for _, bv := range bads[width] {
					local, remote := []uint64{1, 2, 3}, []uint64{4, 5, 6}
					if side == "local" {
						local[1] = bv.v
					} else {
						remote[1] = bv.v
					}
					got := send(width, local, remote)
					want := fmt.Sprintf("%s block id %s (entry 1) is outside the layout's %d blocks", side, bv.shown, blocks)
					if got.code != codes.InvalidArgument || !strings.Contains(got.msg, want) || strings.Contains(got.msg, "plan") {
						t.Errorf("%s, %d-byte ids, %s id %s: %v %q, want InvalidArgument saying %q", name, width, side, bv.shown, got.code, got.msg, want)
					}
					b.unchanged(fmt.Sprintf("%s, %d-byte ids, a refused %s id %s", name, width, side, bv.shown), before)
				}
			}
		}
	}
	// The Go client's ids are uint32: short lists go in the frame, long ones through its id arena.
	long := make([]uint32, 1500)
	for i := range long {
		long[i] = uint32(i)
	}
	for _, tc := range []struct {
		name          string
		local, remote []uint32
		want          string
	}{
		{"a short list", []uint32{1, math.MaxUint32, 3}, []uint32{4, 5, 6}, "local block id 4294967295 (-1 as int32) (entry 1) is outside the layout's 4096 blocks"},
		{"a long list", long, append(append([]uint32(nil), long[:1000]...), append([]uint32{blocks}, long[1001:]...)...),
			"remote block id 4096 (entry 1000) is outside the layout's 4096 blocks"},
	} {
		_, err := c.TransferBlocks(ctx, client.Write, b.src, tc.local, client.ToLayout(b.dst), tc.remote, client.TransferOptions{})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the Go client, %s: %v, want InvalidArgument saying %q", tc.name, err, tc.want)
		}
		_, err = c.SubmitBlocks(ctx, client.Write, b.src, tc.local, client.ToLayout(b.dst), tc.remote, client.TransferOptions{})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the Go client's submission, %s: %v, want InvalidArgument saying %q", tc.name, err, tc.want)
		}
		b.unchanged("the Go client, "+tc.name, before)
	}
	if t.Failed() {
		return
	}

	// In range, every path moves exactly its blocks (each to destinations of its own), the last id included.
	want := b.snapshot()
	next := uint64(0)
	for name, send := range paths {
		for _, width := range []int{4, 8} {
			local, remote := []uint64{blocks - 1, next, 7}, []uint64{next + 1, next + 2, blocks - 1 - next}
			next += 3
			if got := send(width, local, remote); got.code != codes.OK {
				t.Fatalf("%s, %d-byte ids in range: %v %q", name, width, got.code, got.msg)
			}
			for k := range want {
				for i := range local {
					copy(want[k][remote[i]*bs:][:bs], b.srcMem[k].Bytes[local[i]*bs:][:bs])
				}
			}
		}
	}
	if _, err := c.TransferBlocks(ctx, client.Write, b.src, long, client.ToLayout(b.dst), long, client.TransferOptions{}); err != nil {
		t.Fatalf("the Go client, a long list in range: %v", err)
	}
	for k := range want {
		copy(want[k][:len(long)*bs], b.srcMem[k].Bytes[:len(long)*bs])
		if !bytes.Equal(b.dstMem[k].Bytes, want[k]) {
			t.Fatalf("region %d: the in-range transfers did not move exactly their blocks", k)
		}
	}
}
