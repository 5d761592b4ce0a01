package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

func (s *Server) transferBlocks(ctx context.Context, sess *session, req *agentv1.TransferBlocksRequest) (*agentv1.TransferResponse, error) {
	return nil, status.Error(codes.Unimplemented, "block transfers are not served yet")
}
