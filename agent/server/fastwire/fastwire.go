// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// MaxRequest is the largest request the agent reads, a frame on its fast socket as a message through gRPC (whose
// own default receive limit it is): a block transfer of the most ids (65,536 of 8 bytes a side) is 1 MiB, a
// TransferRequest of 65,536 items about 3 MiB. Clients refuse a larger one before sending it.
const MaxRequest = 4 << 20

// Field numbers of FastRequest and TransferBlocksRequest (agent.proto), read by hand on the fast socket.
const (
	fastFieldTransfer = 1
	fastFieldBlocks   = 2
	fastFieldIDArena  = 3
	fastFieldWait     = 4
	fastFieldMailbox  = 5
	fastFieldCallTime = 6

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

// BlocksDecoder reads the block frames of one fast connection into the messages it keeps, so a call allocates
// none of them: the request, its remote layout and its timeout are valid until the next Decode.
type BlocksDecoder struct {
	req     agentv1.TransferBlocksRequest
	remote  agentv1.LayoutRef
	byID    agentv1.LayoutRef_LayoutId
	timeout durationpb.Duration
	// callTimeout is the frame's FastRequest.call_timeout when set (hasCallTimeout).
	callTimeout    durationpb.Duration
	hasCallTimeout bool
}

// CallTimeout is the FastRequest.call_timeout of the frame Decode read last, nil when it had none; valid until the
// next Decode.
func (d *BlocksDecoder) CallTimeout() *durationpb.Duration {
	if !d.hasCallTimeout {
		return nil
	}
	return &d.callTimeout
}

// Decode reads a FastRequest whose request is blocks without copying its id lists: LocalIds and RemoteIds alias
// frame, so the request is valid only until the next frame is read (the ids are decoded into the engines' own
// arrays before that) and the next Decode. A frame holding a FastRequest.transfer returns ErrNotBlocks. It
// reads what proto.Unmarshal would read, and refuses what it would refuse (a string that is not UTF-8).
func (d *BlocksDecoder) Decode(frame []byte) (*agentv1.TransferBlocksRequest, error) {
	req := &d.req
	*req = agentv1.TransferBlocksRequest{}
	d.hasCallTimeout = false
	named := false
	for b := frame; len(b) > 0; {
		num, typ, n := consumeTag(b)
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
			b = b[n:]
			// A message field met twice is merged, as proto.Unmarshal merges it.
			if err := d.decodeBlocks(v); err != nil {
				return nil, err
			}
			named = true
			continue
		}
		if typ == protowire.BytesType && num == fastFieldCallTime {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			if !d.hasCallTimeout {
				d.callTimeout, d.hasCallTimeout = durationpb.Duration{}, true
			}
			if err := decodeDuration(v, &d.callTimeout); err != nil {
				return nil, fmt.Errorf("field %d: %w", num, err)
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	if !named {
		return nil, errors.New("fast request names no transfer")
	}
	return req, nil
}

// decodeBlocks merges a TransferBlocksRequest's bytes into d.req.
func (d *BlocksDecoder) decodeBlocks(body []byte) error {
	req := &d.req
	for b := body; len(b) > 0; {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var err error
		switch {
		case typ == protowire.VarintType && (num == blocksFieldOp || num == blocksFieldLayout || num == blocksFieldIDBytes ||
			num == blocksFieldWait || num == blocksFieldArenaIDs):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
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
				return protowire.ParseError(n)
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
				if req.Remote == nil {
					d.remote = agentv1.LayoutRef{}
					req.Remote = &d.remote
				}
				err = d.decodeLayoutRef(v)
			case blocksFieldTimeout:
				if req.Timeout == nil {
					d.timeout = durationpb.Duration{}
					req.Timeout = &d.timeout
				}
				err = decodeDuration(v, req.Timeout)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
	}
	return nil
}

// Field numbers of LayoutRef and google.protobuf.Duration.
const (
	layoutRefFieldLayoutID = 1
	layoutRefFieldSegment  = 2
	layoutRefFieldNode     = 3

	durationFieldSeconds = 1
	durationFieldNanos   = 2
)

// decodeLayoutRef merges a LayoutRef's bytes into d.remote: a layout id (the usual remote, kept in d.byID), a
// segment (the last of the two named wins, as in a oneof) and a node.
func (d *BlocksDecoder) decodeLayoutRef(b []byte) error {
	ref := &d.remote
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == layoutRefFieldLayoutID && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			d.byID.LayoutId = v
			ref.Target = &d.byID
		case (num == layoutRefFieldSegment || num == layoutRefFieldNode) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if !utf8.Valid(v) {
				return errors.New("string field contains invalid UTF-8")
			}
			if num == layoutRefFieldSegment {
				ref.Target = &agentv1.LayoutRef_Segment{Segment: string(v)}
			} else {
				ref.Node = string(v)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// decodeDuration merges a Duration's bytes into out.
func decodeDuration(b []byte, out *durationpb.Duration) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType || (num != durationFieldSeconds && num != durationFieldNanos) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == durationFieldSeconds {
			out.Seconds = int64(v)
		} else {
			out.Nanos = int32(v)
		}
	}
	return nil
}

// consumeTag is protowire.ConsumeTag with proto.Unmarshal's refusal of field numbers past the largest valid one.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		_, _, n = protowire.ConsumeTag([]byte{0}) // field number 0: protowire's own code for a bad number
		return 0, 0, n
	}
	return num, typ, n
}

// The names a call's session travels under on the agent's gRPC socket, shared by the agent and its clients.
const (
	// SessionHeader is the metadata key a client names the session it registered its memory in with
	// ("<instance>/<session>", as GetInfo answered): a call that reaches another session — the agent restarted, or
	// gRPC re-established the connection under the call — is refused before it does anything, instead of
	// registering memory or moving bytes in a session the client does not know it is in.
	SessionHeader = "fabricxfer-session"
	// SessionLostPrefix starts the message of that refusal (Aborted).
	SessionLostPrefix = "session lost:"
	// AnsweredHeader is the trailer key of an Unavailable status the agent answered itself on a session that goes
	// on (a peer it cannot reach), valued with the agent's instance: gRPC gives the same code for a connection
	// that broke under the call, which ends the caller's session, so a client tells the two apart without
	// waiting to see whether its connection went down.
	AnsweredHeader = "fabricxfer-answered"
)
