// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// ErrRemoteAccess: the peer's NIC refused the access (unknown key, range
// outside the registration: the region was deregistered or never matched).
var ErrRemoteAccess = errors.New("remote NIC refused the access")

// Options configure the engine. Zero values take the defaults noted.
type Options struct {
	// Node is this node's name.
	Node string
	// Provider opens RDMA devices (required).
	Provider Provider
	// NICs are the node's RDMA ports and their ranking per GPU (the engine
	// registers memory on the NIC nearest its GPU); without a usable port the
	// engine says so and moves no bytes.
	NICs NICs
	// Exchanger connects queue pairs through the agent channel (required to move bytes).
	Exchanger Exchanger
	// DMABuf exports GPU memory as dma-buf; nil registers GPU memory through
	// the peer-memory module only.
	DMABuf DMABufExporter
	// Notifier carries notifications to the destination node of a write.
	Notifier engines.NotifySender
	// Yield, when set, names pairs another engine claims (the fabric engine's
	// rule), so engines stay disjoint.
	Yield func(src, dst *engines.MemoryDesc) bool
	// QPsPerPeer is the queue pairs per peer and NIC pair (default 2).
	QPsPerPeer int
	// Depth is the work requests in flight per queue pair (default 64).
	Depth int
	// ChunkBytes cuts segments into work requests of at most this size (default 1 MiB).
	ChunkBytes uint64
	// Workers is how many plans run at once (default 8).
	Workers int
	// DrainTimeout bounds the wait for posted work after a transfer is
	// cancelled; then its queue pairs are torn down (default 5 s).
	DrainTimeout time.Duration
	// ConnectTimeout bounds connecting a queue-pair set (default 10 s).
	ConnectTimeout time.Duration
	// Grace bounds how long Deregister and Close wait for cancelled copies.
	Grace time.Duration
	// Registry, when set, is the composite's region table, shared by every engine of the node (see
	// engines.Regions); nil gives the engine one of its own.
	Registry *engines.Registry
}

// Engine is the rdma engine.
type Engine struct {
	*engines.Base
	opts        Options
	reg         engines.Regions
	slots       *engines.Slots
	unavailable string
	wrIDs       atomic.Uint64

	mu      sync.Mutex
	devices map[string]Device
	sets    map[setKey]*qpSet
	local   map[engines.MemoryID]*localMR
	noMR    map[engines.MemoryID]string
}

// localMR is a local region's registration.
type localMR struct {
	nic    PortName
	mr     MR
	addr   uint64
	method string // "dma-buf", "peer-memory", "host"
}

var _ engines.Engine = (*Engine)(nil)

// New returns the engine. Without a usable NIC it still registers memory (so
// it can say why it claims nothing) but moves no bytes.
func New(opts Options) (*Engine, error) {
	if opts.Node == "" || opts.Provider == nil {
		return nil, fmt.Errorf("rdma engine: %w: node name and provider required", engines.ErrInvalid)
	}
	if err := opts.NICs.validate(); err != nil {
		return nil, err
	}
	if opts.QPsPerPeer <= 0 {
		opts.QPsPerPeer = 2
	}
	if opts.Depth <= 0 {
		opts.Depth = 64
	}
	if opts.ChunkBytes == 0 {
		opts.ChunkBytes = 1 << 20
	}
	if opts.ChunkBytes > 1<<31 {
		return nil, fmt.Errorf("rdma engine: %w: chunk of %d bytes exceeds a work request's 2 GiB", engines.ErrInvalid, opts.ChunkBytes)
	}
	if opts.Workers <= 0 {
		opts.Workers = 8
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 5 * time.Second
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	reg, err := engines.NewRegions(engines.EngineRDMA, opts.Registry, opts.Node, opts.Grace)
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, reg: reg, slots: engines.NewSlots(opts.Workers),
		devices: map[string]Device{}, sets: map[setKey]*qpSet{}, local: map[engines.MemoryID]*localMR{}, noMR: map[engines.MemoryID]string{}}
	e.unavailable = unavailableReason(&opts.NICs)
	if e.unavailable == "" && opts.Exchanger == nil {
		e.unavailable = "no agent channel to exchange queue-pair info"
	}
	// A segment is one work request: segments are cut at the chunk size.
	e.Base = engines.NewBase(engines.EngineRDMA, reg, engines.Limits{MaxSegmentBytes: opts.ChunkBytes}, e.CanHandle)
	return e, nil
}

// Available reports whether the engine moves bytes on this node, and why not.
func (e *Engine) Available() (bool, string) { return e.unavailable == "", e.unavailable }

func (e *Engine) device(nic string) (Device, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if d, ok := e.devices[nic]; ok {
		return d, nil
	}
	port := 1
	if p, ok := usablePort(&e.opts.NICs, nic); ok {
		port = p.Port
	}
	d, err := e.opts.Provider.Open(nic, port)
	if err != nil {
		return nil, fmt.Errorf("opening %s port %d: %w", nic, port, err)
	}
	e.devices[nic] = d
	return d, nil
}

const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

// Register implements engines.Engine: the region is registered on the NIC
// nearest its memory (dma-buf for GPU memory, falling back to peer memory)
// and gets an RDMA key; memory that cannot be registered is kept without one
// and pairs that need it are refused with the reason.
func (e *Engine) Register(ctx context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error) {
	if desc.Node != e.opts.Node {
		return desc, fmt.Errorf("rdma: registering %s: %w: memory of node %q on node %q", desc.ID, engines.ErrInvalid, desc.Node, e.opts.Node)
	}
	if err := desc.Validate(); err != nil {
		return desc, fmt.Errorf("rdma: registering %s: %w", desc.ID, err)
	}
	out := desc
	lm, why := e.registerMR(&desc)
	if lm != nil {
		out.Handles.RDMA = append(slices.Clone(desc.Handles.RDMA), engines.RDMAKey{Device: lm.nic.Device, Addr: lm.addr, RKey: lm.mr.RKey()})
		if len(out.Handles.RDMA) > 16 {
			out.Handles.RDMA = out.Handles.RDMA[len(out.Handles.RDMA)-16:]
		}
	}
	if err := e.reg.AddLocal(out); err != nil {
		if lm != nil {
			lm.mr.Close()
		}
		return desc, fmt.Errorf("rdma: registering %s: %w", desc.ID, err)
	}
	e.mu.Lock()
	if lm != nil {
		e.local[desc.ID] = lm
	} else {
		e.noMR[desc.ID] = why
	}
	e.mu.Unlock()
	return out, nil
}

func (e *Engine) registerMR(d *engines.MemoryDesc) (*localMR, string) {
	if e.unavailable != "" {
		return nil, "rdma unavailable on this node: " + e.unavailable
	}
	nic, err := chooseNIC(&e.opts.NICs, d.Location)
	if err != nil {
		return nil, err.Error()
	}
	dev, err := e.device(nic.Device)
	if err != nil {
		return nil, err.Error()
	}
	if d.Location.Kind == engines.LocationHost {
		if d.Handles.Host == nil {
			return nil, "host memory without a view in this process"
		}
		addr := uint64(uintptr(unsafe.Pointer(&d.Handles.Host[0])))
		mr, err := dev.RegisterMemory(addr, d.Size, access)
		if err != nil {
			return nil, fmt.Sprintf("registering host memory on %s: %v", nic, err)
		}
		return &localMR{nic: nic, mr: mr, addr: addr, method: "host"}, ""
	}
	if d.Handles.Ptr == 0 {
		return nil, "GPU memory without an address in this process"
	}
	addr := uint64(d.Handles.Ptr)
	var dmaErr error
	if e.opts.DMABuf != nil {
		fd, off, err := e.opts.DMABuf.DMABuf(d.Location.Device, addr, d.Size)
		if err == nil {
			mr, rerr := dev.RegisterDMABuf(fd, off, d.Size, addr, access)
			closeFD(fd)
			if rerr == nil {
				return &localMR{nic: nic, mr: mr, addr: addr, method: "dma-buf"}, ""
			}
			err = rerr
		}
		dmaErr = err
	}
	mr, err := dev.RegisterMemory(addr, d.Size, access)
	if err != nil {
		why := fmt.Sprintf("registering GPU memory on %s through peer memory: %v", nic, err)
		if dmaErr != nil {
			why = fmt.Sprintf("registering GPU memory on %s: dma-buf: %v; peer memory: %v", nic, dmaErr, err)
		}
		return nil, why
	}
	return &localMR{nic: nic, mr: mr, addr: addr, method: "peer-memory"}, ""
}

// RegistrationMethod says how a local region was registered ("dma-buf",
// "peer-memory", "host"), or why it was not.
func (e *Engine) RegistrationMethod(id engines.MemoryID) (string, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if lm, ok := e.local[id]; ok {
		return lm.method, ""
	}
	return "", e.noMR[id]
}

// Deregister implements engines.Engine: the registration is dropped once no
// transfer uses the region.
func (e *Engine) Deregister(ctx context.Context, id engines.MemoryID) error {
	if err := e.reg.Remove(ctx, id); err != nil {
		return fmt.Errorf("rdma: %w", err)
	}
	e.mu.Lock()
	lm := e.local[id]
	delete(e.local, id)
	delete(e.noMR, id)
	e.mu.Unlock()
	if lm != nil {
		if err := lm.mr.Close(); err != nil {
			return fmt.Errorf("rdma: deregistered %s, dropping its registration: %w", id, err)
		}
	}
	return nil
}

// CanHandle implements engines.Engine.
func (e *Engine) CanHandle(src, dst *engines.MemoryDesc) (bool, string) {
	if src.Node == dst.Node {
		return false, "both regions on node " + src.Node + " (the same-node engine's pair)"
	}
	if src.Node != e.opts.Node && dst.Node != e.opts.Node {
		return false, "neither region belongs to this node"
	}
	if e.opts.Yield != nil && e.opts.Yield(src, dst) {
		return false, "the fabric engine moves this pair"
	}
	if e.unavailable != "" {
		return false, "rdma unavailable on this node: " + e.unavailable
	}
	local, remote := src, dst
	if dst.Node == e.opts.Node {
		local, remote = dst, src
	}
	e.mu.Lock()
	_, ok := e.local[local.ID]
	why := e.noMR[local.ID]
	e.mu.Unlock()
	if !ok {
		if why == "" {
			why = "not registered with the rdma engine"
		}
		return false, fmt.Sprintf("%s: %s", local.ID, why)
	}
	if len(remote.Handles.RDMA) == 0 {
		return false, fmt.Sprintf("%s has no RDMA key (its node registered it on no NIC)", remote.ID)
	}
	return true, ""
}

// Close implements engines.Engine: cancels transfers, tears down queue pairs
// and registrations.
func (e *Engine) Close() error {
	errs := []error{e.reg.Close()}
	e.mu.Lock()
	sets, locals, devs := e.sets, e.local, e.devices
	e.sets, e.local, e.devices = map[setKey]*qpSet{}, map[engines.MemoryID]*localMR{}, map[string]Device{}
	e.mu.Unlock()
	for _, s := range sets {
		select {
		case <-s.ready:
			for _, c := range s.qps {
				errs = append(errs, c.close())
			}
		default:
		}
	}
	for _, lm := range locals {
		errs = append(errs, lm.mr.Close())
	}
	for _, d := range devs {
		errs = append(errs, d.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rdma: %w", err)
	}
	return nil
}
