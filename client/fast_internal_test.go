// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// BenchmarkOneBlockRequestAndReply is the Go client's own work around a waited one-block call, without the round
// trip: the request built and encoded as sendBlocks and fastBlocks build it, and a success reply decoded. It
// bounds what a prepared form of the call (the Python client's prepare_blocks) could save a Go caller.
func BenchmarkOneBlockRequestAndReply(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids, remoteIDs := []uint32{3}, []uint32{9}
	reply, err := proto.Marshal(&agentv1.FastReply{Response: &agentv1.TransferResponse{Status: &agentv1.TransferStatus{
		TransferId: 1 << 40, State: agentv1.TransferState_TRANSFER_STATE_SUCCEEDED, Bytes: 4096,
		Elapsed: durationpb.New(20 * time.Microsecond)}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req := &agentv1.TransferBlocksRequest{LayoutId: 7, IdBytes: 4, Wait: true,
			Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: 9}}}
		if req.Op, req.Timeout, err = submission(ctx, Write, TransferOptions{}, true); err != nil {
			b.Fatal(err)
		}
		req.LocalIds, req.RemoteIds = packIDs(ids), packIDs(remoteIDs)
		if _, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: req}}); err != nil {
			b.Fatal(err)
		}
		r, err := decodeReply(reply)
		if err != nil {
			b.Fatal(err)
		}
		if err := statusErr(r.GetResponse().GetStatus()); err != nil {
			b.Fatal(err)
		}
	}
}
