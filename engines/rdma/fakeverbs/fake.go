// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fakeverbs

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// Network connects fake devices of any number of nodes.
type Network struct {
	mu      sync.Mutex
	nextLID uint16
	nextQPN uint32
	nextKey uint32
	qps     map[uint64]*QP // by lid<<32 | qpn
	lost    map[string]bool
	held    []heldWR
	holding bool
	// DMABufFails makes every dma-buf registration fail (nodes whose NIC
	// driver lacks dma-buf support), so registration falls back to peer memory.
	DMABufFails bool
	// BeforeCreateQP, when set, runs before each queue pair is created (outside the network's lock): a test
	// holds creations there.
	BeforeCreateQP func(node string)
	// Stats
	Posted, Connected, Created int
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{nextLID: 1, nextQPN: 0x100, nextKey: 0x1000, qps: map[uint64]*QP{}, lost: map[string]bool{}}
}

// Provider is node's view of the network.
func (n *Network) Provider(node string) rdma.Provider { return &provider{n: n, node: node} }

// Lose makes node unreachable: work to or from it completes with
// retry-exceeded and moves the queue pair to ERR, as a dead peer does.
func (n *Network) Lose(node string) {
	n.mu.Lock()
	n.lost[node] = true
	n.mu.Unlock()
}

// Hold stalls all work until release is called; release runs it in order.
func (n *Network) Hold() (release func()) {
	n.mu.Lock()
	n.holding = true
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			n.holding = false
			held := n.held
			n.held = nil
			n.mu.Unlock()
			for _, h := range held {
				h.q.execute(h.wr)
			}
		})
	}
}

type heldWR struct {
	q  *QP
	wr verbs.WorkRequest
}

type provider struct {
	n    *Network
	node string
}

func (p *provider) Open(name string, port int) (rdma.Device, error) {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	d := &Device{n: p.n, node: p.node, name: name, lid: p.n.nextLID, mrs: map[uint32]*mr{}}
	p.n.nextLID++
	return d, nil
}

// Device is a fake NIC port with one protection domain.
type Device struct {
	n    *Network
	node string
	name string
	lid  uint16

	mu     sync.Mutex
	mrs    map[uint32]*mr // by key (lkey == rkey here)
	closed bool
}

type mr struct {
	d          *Device
	key        uint32
	addr, size uint64
	access     verbs.Access
	// DMABuf is true for dma-buf registrations.
	dmabuf bool
}

func (m *mr) LKey() uint32 { return m.key }
func (m *mr) RKey() uint32 { return m.key }
func (m *mr) Close() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if _, ok := m.d.mrs[m.key]; !ok {
		return errors.New("memory region already deregistered")
	}
	delete(m.d.mrs, m.key)
	return nil
}

func (d *Device) register(addr, size uint64, access verbs.Access, dmabuf bool) (rdma.MR, error) {
	if size == 0 {
		return nil, errors.New("EINVAL: zero-length registration")
	}
	d.n.mu.Lock()
	key := d.n.nextKey
	d.n.nextKey++
	d.n.mu.Unlock()
	m := &mr{d: d, key: key, addr: addr, size: size, access: access, dmabuf: dmabuf}
	d.mu.Lock()
	d.mrs[key] = m
	d.mu.Unlock()
	return m, nil
}

// RegisterDMABuf implements rdma.Device.
func (d *Device) RegisterDMABuf(fd int, offset, length, iova uint64, access verbs.Access) (rdma.MR, error) {
	if d.n.DMABufFails {
		return nil, errors.New("EOPNOTSUPP: ibv_reg_dmabuf_mr not supported by this provider")
	}
	if fd < 0 {
		return nil, errors.New("EBADF")
	}
	return d.register(iova, length, access, true)
}

// RegisterMemory implements rdma.Device.
func (d *Device) RegisterMemory(addr, length uint64, access verbs.Access) (rdma.MR, error) {
	return d.register(addr, length, access, false)
}

// CreateQP implements rdma.Device.
func (d *Device) CreateQP(depth int) (rdma.QP, error) {
	if hook := d.n.BeforeCreateQP; hook != nil {
		hook(d.node)
	}
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	q := &QP{d: d, qpn: d.n.nextQPN, depth: depth, state: verbs.QPReset}
	d.n.nextQPN++
	d.n.Created++
	d.n.qps[uint64(d.lid)<<32|uint64(q.qpn)] = q
	return q, nil
}

// Close implements rdma.Device.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

func (d *Device) lookup(key uint32, addr, size uint64, need verbs.Access) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.mrs[key]
	if !ok {
		return fmt.Errorf("no memory region with key %#x", key)
	}
	if addr < m.addr || addr+size > m.addr+m.size || addr+size < addr {
		return fmt.Errorf("[%#x, +%d) outside region [%#x, +%d)", addr, size, m.addr, m.size)
	}
	if m.access&need != need {
		return fmt.Errorf("access %d not granted", need)
	}
	return nil
}

// QP is a fake reliable-connected queue pair.
type QP struct {
	d     *Device
	qpn   uint32
	depth int

	mu     sync.Mutex
	state  verbs.QPState
	remote *QP
	cq     []verbs.Completion
	queued int
}

// Info implements rdma.QP.
func (q *QP) Info() verbs.ConnInfo {
	return verbs.ConnInfo{QPN: q.qpn, PSN: q.qpn * 7, LID: q.d.lid, MTU: 4096}
}

// State implements rdma.QP.
func (q *QP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Connect implements rdma.QP with the verbs transitions.
func (q *QP) Connect(remote verbs.ConnInfo) error {
	q.d.n.mu.Lock()
	peer := q.d.n.qps[uint64(remote.LID)<<32|uint64(remote.QPN)]
	q.d.n.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.QPReset {
		return fmt.Errorf("modify QP %d to INIT: invalid transition from %s", q.qpn, q.state)
	}
	q.state = verbs.QPInit
	if peer == nil {
		return fmt.Errorf("modify QP %d to RTR: no queue pair %d at LID %d", q.qpn, remote.QPN, remote.LID)
	}
	if remote.PSN != remote.QPN*7 {
		return fmt.Errorf("modify QP %d to RTR: PSN mismatch", q.qpn)
	}
	q.state, q.remote = verbs.QPRTR, peer
	q.state = verbs.QPRTS
	q.d.n.mu.Lock()
	q.d.n.Connected++
	q.d.n.mu.Unlock()
	return nil
}

// Post implements rdma.QP.
func (q *QP) Post(wrs []verbs.WorkRequest) error {
	for _, wr := range wrs {
		q.mu.Lock()
		switch {
		case q.state != verbs.QPRTS && q.state != verbs.QPErr:
			st := q.state
			q.mu.Unlock()
			return fmt.Errorf("ibv_post_send on QP %d in state %s: EINVAL", q.qpn, st)
		case q.queued >= q.depth:
			q.mu.Unlock()
			return fmt.Errorf("ibv_post_send on QP %d: ENOMEM (send queue full)", q.qpn)
		}
		q.queued++
		q.mu.Unlock()
		q.d.n.mu.Lock()
		q.d.n.Posted++
		if q.d.n.holding {
			q.d.n.held = append(q.d.n.held, heldWR{q, wr})
			q.d.n.mu.Unlock()
			continue
		}
		q.d.n.mu.Unlock()
		q.execute(wr)
	}
	return nil
}

// execute performs one work request and queues its completion.
func (q *QP) execute(wr verbs.WorkRequest) {
	q.mu.Lock()
	state, peer := q.state, q.remote
	q.mu.Unlock()
	status := verbs.StatusSuccess
	q.d.n.mu.Lock()
	lost := q.d.n.lost[q.d.node] || (peer != nil && q.d.n.lost[peer.d.node])
	q.d.n.mu.Unlock()
	switch {
	case state == verbs.QPErr:
		status = verbs.StatusWRFlushErr
	case lost:
		status = verbs.StatusRetryExcErr
	default:
		localNeed, remoteNeed := verbs.AccessLocalWrite, verbs.AccessRemoteWrite
		if wr.Op == verbs.OpWrite {
			localNeed = 0
		} else {
			remoteNeed = verbs.AccessRemoteRead
		}
		if err := q.d.lookup(wr.LKey, wr.LocalAddr, uint64(wr.Length), localNeed); err != nil {
			status = verbs.StatusLocProtErr
		} else if err := peer.d.lookup(wr.RKey, wr.RemoteAddr, uint64(wr.Length), remoteNeed); err != nil {
			status = verbs.StatusRemAccessErr
		} else {
			local := unsafe.Slice((*byte)(ptr(wr.LocalAddr)), wr.Length)
			remote := unsafe.Slice((*byte)(ptr(wr.RemoteAddr)), wr.Length)
			if wr.Op == verbs.OpWrite {
				copy(remote, local)
			} else {
				copy(local, remote)
			}
		}
	}
	q.mu.Lock()
	if status != verbs.StatusSuccess {
		q.state = verbs.QPErr
	}
	q.queued--
	q.cq = append(q.cq, verbs.Completion{ID: wr.ID, Status: status, VendorErr: uint32(status) << 8})
	q.mu.Unlock()
}

// ptr turns a fake registration address (Go memory the test keeps alive) into a pointer.
func ptr(a uint64) unsafe.Pointer {
	p := uintptr(a)
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

// Poll implements rdma.QP.
func (q *QP) Poll(out []verbs.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.cq)
	q.cq = q.cq[n:]
	return n, nil
}

// Close implements rdma.QP: the queue pair goes to ERR and its outstanding
// work, held or not, completes as flushed.
func (q *QP) Close() error {
	q.mu.Lock()
	q.state = verbs.QPErr
	q.mu.Unlock()
	q.d.n.mu.Lock()
	var mine []verbs.WorkRequest
	kept := q.d.n.held[:0]
	for _, h := range q.d.n.held {
		if h.q == q {
			mine = append(mine, h.wr)
		} else {
			kept = append(kept, h)
		}
	}
	q.d.n.held = kept
	q.d.n.mu.Unlock()
	for _, wr := range mine {
		q.execute(wr)
	}
	return nil
}

// Destroy implements rdma.QP.
func (q *QP) Destroy() error { return nil }
