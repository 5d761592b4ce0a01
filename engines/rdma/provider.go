// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"context"

	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// Provider opens RDMA devices.
type Provider interface {
	// Open opens port of the named device ("mlx5_0").
	Open(name string, port int) (Device, error)
}

// Device is an opened RDMA device port with one protection domain.
type Device interface {
	// RegisterDMABuf registers length bytes at offset of a dma-buf (GPU
	// memory exported by the GPU driver), addressed by peers as iova.
	RegisterDMABuf(fd int, offset, length, iova uint64, access verbs.Access) (MR, error)
	// RegisterMemory registers a virtual range (host memory, or GPU memory
	// through the peer-memory kernel module).
	RegisterMemory(addr, length uint64, access verbs.Access) (MR, error)
	// CreateQP creates a reliable-connected queue pair in RESET with its own
	// completion queue and room for depth outstanding work requests.
	CreateQP(depth int) (QP, error)
	Close() error
}

// MR is a memory registration.
type MR interface {
	LKey() uint32
	RKey() uint32
	Close() error
}

// QP is a reliable-connected queue pair.
type QP interface {
	Info() verbs.ConnInfo
	// Connect moves the queue pair RESET → INIT → RTR → RTS towards remote.
	Connect(remote verbs.ConnInfo) error
	State() verbs.QPState
	// Post posts signaled work requests; on error none after the failing one was posted.
	Post(wrs []verbs.WorkRequest) error
	// Poll reaps up to len(out) completions without blocking.
	Poll(out []verbs.Completion) (int, error)
	// Close moves the queue pair to ERR: what is outstanding completes as flushed.
	Close() error
	// Destroy frees the queue pair and its completion queue, once nothing polls it.
	Destroy() error
}

// Exchanger carries queue-pair connection info to a peer node's rdma engine
// over the agent-to-agent channel; the receiving agent calls that engine's
// AcceptQPs and returns its answer.
type Exchanger interface {
	ExchangeQPs(ctx context.Context, req ExchangeRequest) ([]verbs.ConnInfo, error)
}

// ExchangeRequest asks node To to connect a queue-pair set to the sender's.
type ExchangeRequest struct {
	From, To string
	// FromNIC is the sender's device, ToNIC the receiver's.
	FromNIC, ToNIC string
	QPs            []verbs.ConnInfo
}

// DMABufExporter gives a dma-buf for local GPU memory (cuMemGetHandleForAddressRange).
type DMABufExporter interface {
	// DMABuf returns an fd covering [addr, addr+length) rounded out to pages,
	// and the offset of addr in it; the caller closes the fd.
	DMABuf(gpu int, addr, length uint64) (fd int, offset uint64, err error)
}
