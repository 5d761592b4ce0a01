// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// TestBlocksDecoderReadsWhatUnmarshalReads decodes random block frames with one decoder, frame after frame (so a
// field left over from an earlier frame would show), and compares each request with proto.Unmarshal's reading of
// the same bytes: fields in any order and repeated (a message field merged, the oneof's last choice winning),
// fields of the wrong wire type and unknown fields (skipped), a segment or node that is not UTF-8 (refused by
// both).
func TestBlocksDecoderReadsWhatUnmarshalReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var d BlocksDecoder
	refusedBoth, callTimeouts := 0, 0
	for round := range 3000 {
		frame := randomBlocksFrame(rng)
		var want agentv1.FastRequest
		wantErr := proto.Unmarshal(frame, &want)
		got, err := d.Decode(frame)
		if wantErr != nil || err != nil {
			if (wantErr == nil) != (err == nil) {
				t.Fatalf("round %d: Decode error %v, proto.Unmarshal error %v, frame %x", round, err, wantErr, frame)
			}
			refusedBoth++
			continue
		}
		wb := want.GetBlocks()
		if wb == nil {
			wb = &agentv1.TransferBlocksRequest{} // a frame whose blocks field is empty
		}
		dropUnknown(wb.ProtoReflect())
		if !proto.Equal(got, wb) {
			t.Fatalf("round %d: Decode read\n%v\nproto.Unmarshal read\n%v\nframe %x", round, got, wb, frame)
		}
		if want.CallTimeout != nil {
			dropUnknown(want.CallTimeout.ProtoReflect())
			callTimeouts++
		}
		if ct := d.CallTimeout(); (ct == nil) != (want.CallTimeout == nil) || !proto.Equal(ct, want.CallTimeout) {
			t.Fatalf("round %d: Decode read call_timeout %v, proto.Unmarshal %v, frame %x", round, ct, want.CallTimeout, frame)
		}
	}
	if callTimeouts == 0 {
		t.Fatal("no frame carried a call_timeout: the generator never wrote one")
	}
	if refusedBoth == 0 {
		t.Fatal("no frame was refused: the generator never wrote a string that is not UTF-8")
	}
	// A field number past the largest valid one is refused, as proto.Unmarshal refuses it, inside the request and
	// around it.
	for _, frame := range [][]byte{
		{0x12, 0x06, 0x80, 0xff, 0xff, 0xff, 0x30, 0x00},
		{0x80, 0xff, 0xff, 0xff, 0x30, 0x00, 0x12, 0x00},
	} {
		var want agentv1.FastRequest
		if proto.Unmarshal(frame, &want) == nil {
			t.Fatalf("proto.Unmarshal read %x: the case tests nothing", frame)
		}
		if got, err := d.Decode(frame); err == nil {
			t.Fatalf("Decode read %x as %v", frame, got)
		}
	}
	// A frame of another request is left to proto.Unmarshal.
	wait, _ := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Wait{Wait: &agentv1.FastWait{TransferIds: []uint64{1}}}})
	if _, err := d.Decode(wait); !errors.Is(err, ErrNotBlocks) {
		t.Fatalf("a wait frame: %v, want ErrNotBlocks", err)
	}
}

// TestBlocksDecoderAllocatesNothingForAUsualFrame: a waited one-block frame with a remote layout id and a timeout,
// as the clients send it, is read into the decoder's own messages.
func TestBlocksDecoderAllocatesNothingForAUsualFrame(t *testing.T) {
	frame, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
		Op: agentv1.Op_OP_WRITE, LayoutId: 7, Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: 8}},
		LocalIds: []byte{1, 0, 0, 0}, RemoteIds: []byte{2, 0, 0, 0}, IdBytes: 4, Wait: true}}})
	if err != nil {
		t.Fatal(err)
	}
	frame = protowire.AppendTag(frame, fastFieldBlocks, protowire.BytesType) // and a timeout, merged into it
	frame = protowire.AppendBytes(frame, protowire.AppendBytes(protowire.AppendTag(nil, blocksFieldTimeout, protowire.BytesType),
		protowire.AppendVarint(protowire.AppendTag(nil, durationFieldSeconds, protowire.VarintType), 30)))
	var d BlocksDecoder
	if got := testing.AllocsPerRun(200, func() {
		req, err := d.Decode(frame)
		if err != nil || req.GetRemote().GetLayoutId() != 8 || req.GetTimeout().GetSeconds() != 30 || req.LayoutId != 7 {
			t.Fatalf("decoded %v, %v", req, err)
		}
	}); got != 0 {
		t.Fatalf("%.1f allocations a frame, want none", got)
	}
}

// randomBlocksFrame writes a FastRequest of one or more blocks fields (merged by a reader) whose fields come in
// a random order, some twice, some with the wrong wire type, some unknown.
func randomBlocksFrame(rng *rand.Rand) []byte {
	var frame []byte
	for range 1 + rng.IntN(2) {
		var body []byte
		for range rng.IntN(9) {
			body = appendRandomBlocksField(rng, body)
		}
		frame = protowire.AppendTag(frame, fastFieldBlocks, protowire.BytesType)
		frame = protowire.AppendBytes(frame, body)
	}
	for range rng.IntN(3) { // FastRequest.call_timeout, before or after the blocks, now and then twice (merged)
		at := 0
		if rng.IntN(2) == 0 {
			at = len(frame)
		}
		field := protowire.AppendBytes(protowire.AppendTag(nil, fastFieldCallTime, protowire.BytesType), randomDuration(rng))
		frame = append(frame[:at:at], append(field, frame[at:]...)...)
	}
	if rng.IntN(8) == 0 {
		frame = protowire.AppendTag(frame, 99, protowire.VarintType)
		frame = protowire.AppendVarint(frame, rng.Uint64())
	}
	return frame
}

// randomDuration is a Duration's bytes: seconds, nanos and an unknown field, in any order and number.
func randomDuration(rng *rand.Rand) []byte {
	var dur []byte
	for range rng.IntN(3) {
		num := protowire.Number(1 + rng.IntN(3))
		dur = protowire.AppendVarint(protowire.AppendTag(dur, num, protowire.VarintType), rng.Uint64N(1<<40))
	}
	return dur
}

func appendRandomBlocksField(rng *rand.Rand, b []byte) []byte {
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
	}
	bytesField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	switch rng.IntN(12) {
	case 0:
		return varint(blocksFieldOp, uint64(rng.IntN(4)))
	case 1:
		return varint(blocksFieldLayout, rng.Uint64())
	case 2:
		return bytesField(blocksFieldRemote, randomLayoutRef(rng))
	case 3:
		return bytesField(blocksFieldLocalIDs, randomBytes(rng, 16))
	case 4:
		return bytesField(blocksFieldRemoteIDs, randomBytes(rng, 16))
	case 5:
		return varint(blocksFieldIDBytes, uint64(rng.IntN(10)))
	case 6:
		return bytesField(blocksFieldTimeout, randomDuration(rng))
	case 7:
		return bytesField(blocksFieldNotify, randomBytes(rng, 8))
	case 8:
		return varint(blocksFieldWait, uint64(rng.IntN(3)))
	case 9:
		return varint(blocksFieldArenaIDs, uint64(rng.IntN(1<<20)))
	case 10: // a known field of the wrong wire type
		return bytesField(blocksFieldLayout, randomBytes(rng, 4))
	default: // an unknown field
		return varint(protowire.Number(20+rng.IntN(10)), rng.Uint64())
	}
}

func randomLayoutRef(rng *rand.Rand) []byte {
	var b []byte
	for range rng.IntN(4) {
		switch rng.IntN(5) {
		case 0:
			b = protowire.AppendVarint(protowire.AppendTag(b, layoutRefFieldLayoutID, protowire.VarintType), rng.Uint64())
		case 1:
			b = protowire.AppendBytes(protowire.AppendTag(b, layoutRefFieldSegment, protowire.BytesType), randomName(rng))
		case 2:
			b = protowire.AppendBytes(protowire.AppendTag(b, layoutRefFieldNode, protowire.BytesType), randomName(rng))
		case 3:
			b = protowire.AppendBytes(protowire.AppendTag(b, layoutRefFieldLayoutID, protowire.BytesType), randomBytes(rng, 3))
		default:
			b = protowire.AppendVarint(protowire.AppendTag(b, 9, protowire.VarintType), 1)
		}
	}
	return b
}

// randomName is a short name, now and then one that is not UTF-8.
func randomName(rng *rand.Rand) []byte {
	if rng.IntN(10) == 0 {
		return []byte{'k', 0xff, 'v'}
	}
	return []byte([]string{"kv", "node-b", "", "prefill/kv"}[rng.IntN(4)])
}

func randomBytes(rng *rand.Rand, most int) []byte {
	b := make([]byte, rng.IntN(most+1))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// dropUnknown clears the unknown fields of m and of the messages it holds: Decode skips them, as it must.
func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			dropUnknown(v.Message())
		}
		return true
	})
}

// TestResponseReplyIsWhatMarshalWrites compares the hand-written reply with proto.Marshal's for random responses
// (fields zero and not, engines empty or with an empty name, a status or none, failures with empty fields,
// elapsed times negative and not): the same length, the same message decoded, the status first and its state
// first within it; and a string
// that is not UTF-8 is left to proto.Marshal, which refuses it.
func TestResponseReplyIsWhatMarshalWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	pick := func(vals ...uint64) uint64 { return vals[rng.IntN(len(vals))] }
	str := func() string {
		return []string{"", "xgmi", "blocks", "DEADLINE_EXCEEDED", "copy of 4096 bytes failed: ünïcode"}[rng.IntN(5)]
	}
	for round := range 2000 {
		r := &agentv1.TransferResponse{TransferId: pick(0, 1, 300, 1<<40, 1<<63), Items: uint32(pick(0, 1, 15360, 1<<31)), Bytes: pick(0, 4096, 1<<30)}
		for range rng.IntN(3) {
			r.Engines = append(r.Engines, str())
		}
		if rng.IntN(4) > 0 {
			st := &agentv1.TransferStatus{TransferId: r.TransferId, State: agentv1.TransferState(rng.IntN(6)), Bytes: pick(0, 4096), Error: str()}
			for range rng.IntN(3) {
				st.Failures = append(st.Failures, &agentv1.TagFailure{Tag: str(), Code: str(), Message: str()})
			}
			if rng.IntN(3) > 0 {
				st.Elapsed = &durationpb.Duration{Seconds: int64(pick(0, 1, 1<<40)) * int64(1-2*rng.IntN(2)), Nanos: int32(rng.IntN(2e9) - 1e9)}
			}
			r.Status = st
		}
		want, err := proto.Marshal(&agentv1.FastReply{Response: r})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := AppendResponseReply([]byte{9}, r)
		if !ok || got[0] != 9 {
			t.Fatalf("round %d: %v\nwrote   %x (%v)\nMarshal %x", round, r, got, ok, want)
		}
		if err := sameReply(got[1:], want, r); err != nil {
			t.Fatalf("round %d: %v\nwrote   %x\nMarshal %x", round, err, got[1:], want)
		}
	}
	// A waited success as a client reads it: 1a LEN 2a LEN' and the status in the LEN' bytes after.
	st := &agentv1.TransferStatus{TransferId: 1<<40 + 3, State: agentv1.TransferState_TRANSFER_STATE_SUCCEEDED, Bytes: 4096,
		Elapsed: &durationpb.Duration{Nanos: 23456}}
	got, _ := AppendResponseReply(nil, &agentv1.TransferResponse{TransferId: st.TransferId, Items: 1, Bytes: 4096, Engines: []string{"xgmi"}, Status: st})
	var read agentv1.TransferStatus
	if got[0] != 0x1a || int(got[1]) != len(got)-2 || got[2] != 0x2a || proto.Unmarshal(got[4:4+int(got[3])], &read) != nil || !proto.Equal(&read, st) {
		t.Fatalf("a waited success's reply %x: the status is not in the bytes after 1a LEN 2a LEN'", got)
	}
	if got[4] != 0x10 || got[5] != byte(agentv1.TransferState_TRANSFER_STATE_SUCCEEDED) {
		t.Fatalf("a waited success's reply %x: its status does not start 10 02 (the state, as a client tells a success)", got)
	}
	if got, ok := AppendResponseReply([]byte{9}, nil); !ok || !bytes.Equal(got, []byte{9}) {
		t.Fatalf("no response (the answer to a setup): wrote %x, %v; want the empty reply", got, ok)
	}
	bad := &agentv1.TransferResponse{TransferId: 1, Status: &agentv1.TransferStatus{Error: "k\xffv"}}
	if got, ok := AppendResponseReply(nil, bad); ok || len(got) != 0 {
		t.Fatalf("a status whose error is not UTF-8: wrote %x, %v", got, ok)
	}
	if _, err := proto.Marshal(&agentv1.FastReply{Response: bad}); err == nil {
		t.Fatal("proto.Marshal took a string that is not UTF-8: the fallback would not refuse it")
	}
}

// sameReply checks a hand-written reply against proto.Marshal's bytes want of FastReply{Response: r}: as long,
// decoding to the same message, the response's status, if any, its first field, and the status's state its own.
func sameReply(got, want []byte, r *agentv1.TransferResponse) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d bytes, proto.Marshal writes %d", len(got), len(want))
	}
	var back agentv1.FastReply
	if err := proto.Unmarshal(got, &back); err != nil {
		return fmt.Errorf("decoding the reply: %w", err)
	}
	if !proto.Equal(&back, &agentv1.FastReply{Response: r}) {
		return fmt.Errorf("decodes to %v", &back)
	}
	if r == nil || r.Status == nil {
		return nil
	}
	_, _, n := protowire.ConsumeTag(got)
	_, m := protowire.ConsumeVarint(got[n:])
	num, _, k := protowire.ConsumeTag(got[n+m:])
	if num != responseFieldStatus {
		return fmt.Errorf("the response's first field is %d, not its status", num)
	}
	if r.Status.State == 0 {
		return nil // not written
	}
	_, l := protowire.ConsumeVarint(got[n+m+k:])
	if num, _, _ := protowire.ConsumeTag(got[n+m+k+l:]); num != statusFieldState {
		return fmt.Errorf("the status's first field is %d, not its state", num)
	}
	return nil
}
