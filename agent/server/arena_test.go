// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

func fastMsg(t *testing.T, m *agentv1.FastRequest) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIDArenaIsCheckedAndItsIDsCopiedOnce: a fast connection's id arena must be a sealed memfd of a bounded size
// passed by its own caller; a transfer reads its ids from it only when asked, within it, and never beside ids in
// the frame. Every refusal is a clear InvalidArgument on a connection that stays up, and moves nothing; the good
// arena moves exactly the blocks it names, and what the caller writes into it afterwards changes nothing.
func TestIDArenaIsCheckedAndItsIDsCopiedOnce(t *testing.T) {
	const bs, blocks = 64, 4096
	b := newFastBlocksBed(t, 5, blocks, bs)
	a, c, ctx, rng := b.a, b.c, b.ctx, b.rng
	src, srcMem, dst, dstMem := b.src, b.srcMem, b.dst, b.dstMem
	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	put, refused, snapshot, unchanged := b.put, b.refused, b.snapshot, b.unchanged
	setArena := func(token string, size uint64) *agentv1.FastReply {
		return rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_IdArena{
			IdArena: &agentv1.IdArena{FdToken: token, Size: size}}}))
	}
	blocksReq := func(n uint32, local, remote []byte) *agentv1.FastReply {
		return rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
			Op: agentv1.Op_OP_WRITE, LayoutId: src.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: dst.ID()}},
			IdBytes: 4, ArenaIds: n, LocalIds: local, RemoteIds: remote, Wait: true}}}))
	}

	before := snapshot()
	refused("ids in an arena the connection does not have", blocksReq(4, nil, nil), "no id arena")
	unsealed := memfd(t, 1<<20, unix.MFD_ALLOW_SEALING)
	refused("unsealed memfd", setArena(put(unsealed), 1<<20), "not sealed against shrinking")
	untouched := memfd(t, 1<<20, unix.MFD_ALLOW_SEALING)
	if err := client.SealShrink(untouched); err != nil {
		t.Fatal(err)
	}
	refused("sealed memfd nobody touched", setArena(put(untouched), 1<<20), "nobody has touched")
	good := shm(t, 1<<20)
	refused("arena larger than its memfd", setArena(put(good.File), 2<<20), "outside the passed memory")
	refused("arena past the bound", setArena(put(good.File), 64<<20), "between 1 byte and")
	refused("empty arena", setArena(put(good.File), 0), "between 1 byte and")
	refused("unknown token", setArena("no-such-token", 1<<20), "id arena")
	unchanged("refused arenas", before)

	// Setting an arena again replaces the old mapping: a caller repeating it holds one mapping, not many. Only
	// shared-memory mappings are counted: the Go runtime maps more of other kinds (thread stacks, heap) as it
	// pleases, which on a loaded machine grew the count by five in 50 rounds.
	maps := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte("/memfd:"))
	}
	if r := setArena(put(good.File), 1<<20); r.Code != 0 {
		t.Fatalf("a sealed memfd of 1 MiB: %v", r)
	}
	mapped := maps()
	for range 50 {
		if r := setArena(put(good.File), 1<<20); r.Code != 0 {
			t.Fatalf("setting the arena again: %v", r)
		}
	}
	if n := maps(); n > mapped+1 {
		t.Fatalf("50 arena replacements grew the shared-memory mappings from %d to %d", mapped, n)
	}
	ids := good.Bytes
	refused("more ids than the arena holds", blocksReq(1<<18, nil, nil), "need")
	refused("ids in the arena and in the frame", blocksReq(1, []byte{0, 0, 0, 0}, []byte{1, 0, 0, 0}), "not both")
	const n = 1500
	local, remote := rng.Perm(blocks)[:n], rng.Perm(blocks)[:n]
	for i := range n {
		binary.LittleEndian.PutUint32(ids[4*i:], uint32(local[i]))
		binary.LittleEndian.PutUint32(ids[4*(n+i):], uint32(remote[i]))
	}
	binary.LittleEndian.PutUint32(ids[4*(n+7):], blocks) // one destination past the layout
	refused("an id out of range in the arena", blocksReq(n, nil, nil), "")
	unchanged("a refused list", before)
	binary.LittleEndian.PutUint32(ids[4*(n+7):], uint32(remote[7]))
	if r := blocksReq(n, nil, nil); r.Code != 0 || r.Response.GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("good ids in the arena: %v", r)
	}
	clear(ids) // the caller's later writes change nothing moved
	for k := range dstMem {
		want := before[k]
		for i := range n {
			copy(want[remote[i]*bs:][:bs], srcMem[k].Bytes[local[i]*bs:][:bs])
		}
		if !bytes.Equal(dstMem[k].Bytes, want) {
			t.Fatalf("region %d: the blocks the arena named did not land exactly", k)
		}
	}
	// gRPC has no arena.
	_, err := c.API().TransferBlocks(ctx, &agentv1.TransferBlocksRequest{Op: agentv1.Op_OP_WRITE, LayoutId: src.ID(),
		Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: dst.ID()}}, IdBytes: 4, ArenaIds: 2, Wait: true})
	if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no id arena") {
		t.Fatalf("gRPC with arena ids: %v", err)
	}
}

// fastBlocksBed is an agent with two host layouts of equal geometry for the fast socket's refusal tests, and the
// checks they share: a token for a file, a refusal's code and words, and the destination's bytes before and after.
type fastBlocksBed struct {
	t              *testing.T
	a              *agent
	c              *client.Client
	ctx            context.Context
	rng            *rand.Rand
	src, dst       *client.Layout
	srcMem, dstMem []*client.SharedMemory
}

func newFastBlocksBed(t *testing.T, seed uint64, blocks int, bs uint64) *fastBlocksBed {
	b := &fastBlocksBed{t: t, a: startAgent(t, baseOptions(t, newProcFixture(t))), ctx: ctxT(t), rng: rand.New(rand.NewPCG(seed, seed+1))}
	b.c = dial(t, b.a)
	b.src, b.srcMem = hostLayout(t, b.c, b.rng, 2, blocks, bs)
	b.dst, b.dstMem = hostLayout(t, b.c, b.rng, 2, blocks, bs)
	return b
}

// put passes f through the agent's fd socket and returns its token.
func (b *fastBlocksBed) put(f *os.File) string {
	b.t.Helper()
	token, err := fdpass.Put(b.ctx, b.a.srv.FDSocketPath(), f)
	if err != nil {
		b.t.Fatal(err)
	}
	return token
}

func (b *fastBlocksBed) refused(what string, r *agentv1.FastReply, says string) {
	b.t.Helper()
	if codes.Code(r.Code) != codes.InvalidArgument || !strings.Contains(r.Message, says) {
		b.t.Fatalf("%s: %v %q, want InvalidArgument saying %q", what, codes.Code(r.Code), r.Message, says)
	}
}

func (b *fastBlocksBed) snapshot() [][]byte {
	var out [][]byte
	for _, m := range b.dstMem {
		out = append(out, bytes.Clone(m.Bytes))
	}
	return out
}

func (b *fastBlocksBed) unchanged(what string, before [][]byte) {
	b.t.Helper()
	for k, m := range b.dstMem {
		if !bytes.Equal(m.Bytes, before[k]) {
			b.t.Fatalf("%s changed destination region %d", what, k)
		}
	}
}
