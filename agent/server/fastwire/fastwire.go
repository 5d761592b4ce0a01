// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// Field numbers of FastRequest and TransferBlocksRequest (agent.proto), read by hand on the fast socket.
const (
	fastFieldTransfer = 1
	fastFieldBlocks   = 2
	fastFieldIDArena  = 3
	fastFieldWait     = 4
	fastFieldMailbox  = 5

	blocksFieldOp        = 1
	blocksFieldLayout    = 2
	blocksFieldRemote    = 3
	blocksFieldLocalIDs  = 4
	blocksFieldRemoteIDs = 5
	blocksFieldIDBytes   = 6
	blocksFieldTimeout   = 7
	blocksFieldNotify    = 8
	blocksFieldWait      = 9
	blocksFieldArenaIDs  = 10
)

// ErrNotBlocks says the frame is a FastRequest.transfer, .id_arena, .wait or .mailbox, decoded the general way.
var ErrNotBlocks = errors.New("a transfer or arena frame")

// DecodeBlocks reads a FastRequest whose request is blocks without copying its id lists: LocalIds and
// RemoteIds alias frame, so the request is valid only until the next frame is read (the ids are decoded into
// the engines' own arrays before that). A frame holding a FastRequest.transfer returns ErrNotBlocks.
func DecodeBlocks(frame []byte) (*agentv1.TransferBlocksRequest, error) {
	var body []byte
	for b := frame; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == fastFieldTransfer || num == fastFieldIDArena || num == fastFieldWait || num == fastFieldMailbox) {
			return nil, ErrNotBlocks
		}
		if typ == protowire.BytesType && num == fastFieldBlocks {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			body, b = v, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	if body == nil {
		return nil, errors.New("fast request names no transfer")
	}
	req := &agentv1.TransferBlocksRequest{}
	for b := body; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		var err error
		switch {
		case typ == protowire.VarintType && (num == blocksFieldOp || num == blocksFieldLayout || num == blocksFieldIDBytes ||
			num == blocksFieldWait || num == blocksFieldArenaIDs):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case blocksFieldOp:
				req.Op = agentv1.Op(int32(v))
			case blocksFieldLayout:
				req.LayoutId = v
			case blocksFieldIDBytes:
				req.IdBytes = uint32(v)
			case blocksFieldWait:
				req.Wait = protowire.DecodeBool(v)
			case blocksFieldArenaIDs:
				req.ArenaIds = uint32(v)
			}
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case blocksFieldLocalIDs:
				req.LocalIds = v
			case blocksFieldRemoteIDs:
				req.RemoteIds = v
			case blocksFieldNotify:
				req.Notify = append([]byte(nil), v...) // outlives the frame
			case blocksFieldRemote:
				req.Remote = &agentv1.LayoutRef{}
				err = proto.Unmarshal(v, req.Remote)
			case blocksFieldTimeout:
				req.Timeout = &durationpb.Duration{}
				err = proto.Unmarshal(v, req.Timeout)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
		}
		if err != nil {
			return nil, fmt.Errorf("field %d: %w", num, err)
		}
	}
	return req, nil
}
