// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// FuzzBlocksDecoder: whatever a caller writes, Decode does not panic; a frame it reads is what proto.Unmarshal
// reads, and one it refuses (other than as not a block frame) proto.Unmarshal refuses too. One decoder reads
// every input, as a connection's does.
func FuzzBlocksDecoder(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 32 {
		f.Add(randomBlocksFrame(rng))
	}
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x00})
	var d BlocksDecoder
	f.Fuzz(func(t *testing.T, frame []byte) {
		got, err := d.Decode(frame)
		if errors.Is(err, ErrNotBlocks) {
			return
		}
		var want agentv1.FastRequest
		wantErr := proto.Unmarshal(frame, &want)
		if err != nil {
			if wantErr == nil && want.GetBlocks() != nil {
				t.Fatalf("Decode refused a frame proto.Unmarshal reads (%v): %x", err, frame)
			}
			return
		}
		if wantErr != nil {
			t.Fatalf("Decode read a frame proto.Unmarshal refuses (%v): %x", wantErr, frame)
		}
		wb := want.GetBlocks()
		if wb == nil {
			wb = &agentv1.TransferBlocksRequest{}
		}
		dropUnknown(wb.ProtoReflect())
		if !proto.Equal(got, wb) {
			t.Fatalf("Decode read\n%v\nproto.Unmarshal read\n%v\nframe %x", got, wb, frame)
		}
		if want.CallTimeout != nil {
			dropUnknown(want.CallTimeout.ProtoReflect())
		}
		if ct := d.CallTimeout(); (ct == nil) != (want.CallTimeout == nil) || !proto.Equal(ct, want.CallTimeout) {
			t.Fatalf("Decode read call_timeout %v, proto.Unmarshal %v, frame %x", ct, want.CallTimeout, frame)
		}
	})
}

// FuzzResponseReply: for any response (read from the input as proto.Unmarshal reads it, its unknown fields
// dropped, as the agent's own responses have none), the hand-written reply decodes to it, as long as
// proto.Marshal's, its status first, or it declines exactly when proto.Marshal refuses.
func FuzzResponseReply(f *testing.F) {
	seed, _ := proto.Marshal(&agentv1.TransferResponse{TransferId: 7, Items: 1, Bytes: 4096, Engines: []string{"xgmi"},
		Status: &agentv1.TransferStatus{TransferId: 7, State: agentv1.TransferState_TRANSFER_STATE_FAILED,
			Failures: []*agentv1.TagFailure{{Tag: "blocks", Code: "NOT_FOUND", Message: "gone"}}, Error: "gone"}})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		var r agentv1.TransferResponse
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(in, &r); err != nil {
			return
		}
		want, wantErr := proto.Marshal(&agentv1.FastReply{Response: &r})
		got, ok := AppendResponseReply(nil, &r)
		if ok != (wantErr == nil) {
			t.Fatalf("hand-written %v, proto.Marshal error %v, for %v", ok, wantErr, &r)
		}
		if ok {
			if err := sameReply(got, want, &r); err != nil {
				t.Fatalf("for %v: %v\nwrote   %x\nMarshal %x", &r, err, got, want)
			}
		}
	})
}
