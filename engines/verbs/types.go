// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package verbs

import "fmt"

// ConnInfo is what the other end of a reliable-connected queue pair needs.
type ConnInfo struct {
	QPN uint32
	PSN uint32
	LID uint16
	// GID is the port's RoCE v2 (or InfiniBand) global id; zero on IB fabrics that route by LID.
	GID [16]byte
	// MTU is the active path MTU in bytes.
	MTU int
}

// Access flags of a memory registration (IBV_ACCESS_*).
type Access int

// Access flags.
const (
	AccessLocalWrite  Access = 1
	AccessRemoteWrite Access = 2
	AccessRemoteRead  Access = 4
)

// Op is a one-sided operation.
type Op int

// Operations.
const (
	OpWrite Op = iota // IBV_WR_RDMA_WRITE
	OpRead            // IBV_WR_RDMA_READ
)

func (o Op) String() string {
	if o == OpRead {
		return "read"
	}
	return "write"
}

// WorkRequest is one signaled one-sided operation of a single scatter entry.
type WorkRequest struct {
	ID         uint64
	Op         Op
	LocalAddr  uint64
	LKey       uint32
	Length     uint32
	RemoteAddr uint64
	RKey       uint32
}

// Status is a work completion status (enum ibv_wc_status).
type Status int

// Work completion statuses.
const (
	StatusSuccess      Status = 0
	StatusLocLenErr    Status = 1
	StatusLocQPOpErr   Status = 2
	StatusLocEECOpErr  Status = 3
	StatusLocProtErr   Status = 4
	StatusWRFlushErr   Status = 5
	StatusMWBindErr    Status = 6
	StatusBadRespErr   Status = 7
	StatusLocAccessErr Status = 8
	StatusRemInvReqErr Status = 9
	StatusRemAccessErr Status = 10
	StatusRemOpErr     Status = 11
	StatusRetryExcErr  Status = 12
	StatusRNRRetryExc  Status = 13
	StatusFatalErr     Status = 19
	StatusRespTimeout  Status = 20
	StatusGeneralErr   Status = 21
)

var statusNames = map[Status]string{
	StatusSuccess: "success", StatusLocLenErr: "local length error", StatusLocQPOpErr: "local QP operation error",
	StatusLocEECOpErr: "local EE context operation error", StatusLocProtErr: "local protection error",
	StatusWRFlushErr: "work request flushed", StatusMWBindErr: "memory window bind error",
	StatusBadRespErr: "bad response", StatusLocAccessErr: "local access error",
	StatusRemInvReqErr: "remote invalid request", StatusRemAccessErr: "remote access error",
	StatusRemOpErr: "remote operation error", StatusRetryExcErr: "transport retry counter exceeded",
	StatusRNRRetryExc: "RNR retry counter exceeded", StatusFatalErr: "fatal error",
	StatusRespTimeout: "response timeout", StatusGeneralErr: "general error",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", int(s))
}

// Completion is one work completion.
type Completion struct {
	ID        uint64
	Status    Status
	VendorErr uint32
}

// QPState is a queue pair's state (enum ibv_qp_state).
type QPState int

// Queue pair states.
const (
	QPReset QPState = iota
	QPInit
	QPRTR
	QPRTS
	QPSQD
	QPSQE
	QPErr
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPSQD:
		return "SQD"
	case QPSQE:
		return "SQE"
	case QPErr:
		return "ERR"
	}
	return fmt.Sprintf("state %d", int(s))
}
