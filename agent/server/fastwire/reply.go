// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"net"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// WriteReply sends r as one frame (replies outside the request loop, which marshals into a buffer of its own).
func WriteReply(conn net.Conn, r *agentv1.FastReply) error {
	b, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	return sockio.WriteFrame(conn, b)
}

// ErrReply is the reply that carries err as a gRPC status.
func ErrReply(err error) *agentv1.FastReply {
	st := status.Convert(err)
	return &agentv1.FastReply{Code: uint32(st.Code()), Message: st.Message()}
}

// Field numbers of FastReply, TransferResponse, TransferStatus, TagFailure and Duration, written by hand.
const (
	replyFieldResponse = 3

	responseFieldID      = 1
	responseFieldItems   = 2
	responseFieldBytes   = 3
	responseFieldEngines = 4
	responseFieldStatus  = 5

	statusFieldID       = 1
	statusFieldState    = 2
	statusFieldFailures = 3
	statusFieldBytes    = 4
	statusFieldElapsed  = 5
	statusFieldError    = 6

	failureFieldTag     = 1
	failureFieldCode    = 2
	failureFieldMessage = 3
)

// AppendResponseReply appends FastReply{Response: resp} without reflection, zero values left out as
// proto.Marshal leaves them: every served fast call is answered this way (a nil resp, the answer to a setup, is
// the empty reply). The response's status comes first, before its other fields, and its state first within it
// (agent.proto, FastReply): a waiting client reads the status alone, from the reply's fourth byte, and tells a
// success by two bytes at a fixed place (10 02 from the fifth), without decoding anything. ok is false,
// and nothing appended, when a string of resp is not UTF-8, which proto.Marshal refuses: marshal it to hear
// why.
func AppendResponseReply(b []byte, resp *agentv1.TransferResponse) (_ []byte, ok bool) {
	if resp == nil {
		return b, true
	}
	if !responseUTF8(resp) {
		return b, false
	}
	b = protowire.AppendTag(b, replyFieldResponse, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(responseSize(resp)))
	if st := resp.Status; st != nil {
		b = protowire.AppendTag(b, responseFieldStatus, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = AppendUint(b, statusFieldState, uint64(int64(st.State)))
		b = AppendUint(b, statusFieldID, st.TransferId)
		for _, f := range st.Failures {
			b = protowire.AppendTag(b, statusFieldFailures, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(failureSize(f)))
			b = appendString(b, failureFieldTag, f.Tag, false)
			b = appendString(b, failureFieldCode, f.Code, false)
			b = appendString(b, failureFieldMessage, f.Message, false)
		}
		b = AppendUint(b, statusFieldBytes, st.Bytes)
		if d := st.Elapsed; d != nil {
			b = AppendDuration(b, statusFieldElapsed, d.Seconds, d.Nanos)
		}
		b = appendString(b, statusFieldError, st.Error, false)
	}
	b = AppendUint(b, responseFieldID, resp.TransferId)
	b = AppendUint(b, responseFieldItems, uint64(resp.Items))
	b = AppendUint(b, responseFieldBytes, resp.Bytes)
	for _, e := range resp.Engines {
		b = appendString(b, responseFieldEngines, e, true)
	}
	return b, true
}

// responseUTF8 reports whether every string of r is UTF-8.
func responseUTF8(r *agentv1.TransferResponse) bool {
	for _, e := range r.Engines {
		if !utf8.ValidString(e) {
			return false
		}
	}
	st := r.Status
	if st == nil {
		return true
	}
	for _, f := range st.Failures {
		if !utf8.ValidString(f.Tag) || !utf8.ValidString(f.Code) || !utf8.ValidString(f.Message) {
			return false
		}
	}
	return utf8.ValidString(st.Error)
}

func responseSize(r *agentv1.TransferResponse) int {
	n := UintSize(responseFieldID, r.TransferId) + UintSize(responseFieldItems, uint64(r.Items)) + UintSize(responseFieldBytes, r.Bytes)
	for _, e := range r.Engines {
		n += stringSize(responseFieldEngines, e, true)
	}
	if r.Status != nil {
		n += messageSize(responseFieldStatus, statusSize(r.Status))
	}
	return n
}

func statusSize(st *agentv1.TransferStatus) int {
	n := UintSize(statusFieldID, st.TransferId) + UintSize(statusFieldState, uint64(int64(st.State))) + UintSize(statusFieldBytes, st.Bytes) +
		stringSize(statusFieldError, st.Error, false)
	for _, f := range st.Failures {
		n += messageSize(statusFieldFailures, failureSize(f))
	}
	if d := st.Elapsed; d != nil {
		n += messageSize(statusFieldElapsed, DurationSize(d.Seconds, d.Nanos))
	}
	return n
}

func failureSize(f *agentv1.TagFailure) int {
	return stringSize(failureFieldTag, f.Tag, false) + stringSize(failureFieldCode, f.Code, false) + stringSize(failureFieldMessage, f.Message, false)
}

// DurationSize is the size of a google.protobuf.Duration's fields (seconds and nanos, each left out when zero).
func DurationSize(seconds int64, nanos int32) int {
	return UintSize(durationFieldSeconds, uint64(seconds)) + UintSize(durationFieldNanos, uint64(int64(nanos)))
}

// AppendDuration appends a google.protobuf.Duration as field num (the client's block requests write their timeout
// with it too).
func AppendDuration(b []byte, num protowire.Number, seconds int64, nanos int32) []byte {
	b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(DurationSize(seconds, nanos)))
	b = AppendUint(b, durationFieldSeconds, uint64(seconds))
	return AppendUint(b, durationFieldNanos, uint64(int64(nanos)))
}

// AppendUint appends a varint field, left out when zero (proto3's scalars); the client writes its block requests
// with it too.
func AppendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendString appends a string field; a singular one is left out when empty, an element of a repeated one is not.
func appendString(b []byte, num protowire.Number, s string, repeated bool) []byte {
	if s == "" && !repeated {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

// UintSize is the size of the varint field AppendUint writes.
func UintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func stringSize(num protowire.Number, s string, repeated bool) int {
	if s == "" && !repeated {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func messageSize(num protowire.Number, size int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(size)
}
