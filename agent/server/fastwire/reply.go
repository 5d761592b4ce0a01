// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"net"

	"google.golang.org/grpc/status"
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
