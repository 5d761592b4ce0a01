// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package verbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Lib is an opened libibverbs.
type Lib struct {
	path string
	f    struct {
		getDeviceList, freeDeviceList, getDeviceName, openDevice, closeDevice uintptr
		allocPD, deallocPD, regMR, regDmabufMR, deregMR                       uintptr
		createCQ, destroyCQ, createQP, modifyQP, destroyQP                    uintptr
		queryPort, queryGID                                                   uintptr
	}
	// SysfsRoot is where port GID types are read ("/sys" by default).
	SysfsRoot string
}

// Offsets into rdma-core's public structs (x86-64 and arm64 share them).
const (
	ctxOpsOffset      = 8               // ibv_context.ops follows the device pointer
	opsPollCQ         = 11              // ibv_context_ops.poll_cq
	opsPostSend       = 25              // ibv_context_ops.post_send
	mrLKeyOffset      = 36              // ibv_mr.lkey
	mrRKeyOffset      = 40              // ibv_mr.rkey
	qpNumOffset       = 52              // ibv_qp.qp_num
	qpStateOffset     = 56              // ibv_qp.state
	portStateOffset   = 0               // ibv_port_attr.state
	portMTUOffset     = 8               // ibv_port_attr.active_mtu
	portGIDTblOffset  = 12              // ibv_port_attr.gid_tbl_len
	portLIDOffset     = 34              // ibv_port_attr.lid
	portLinkOffset    = 46              // ibv_port_attr.link_layer
	sendWRSize        = 128             // sizeof(struct ibv_send_wr)
	wcSize            = 48              // sizeof(struct ibv_wc)
	qpAttrSize        = 144             // sizeof(struct ibv_qp_attr)
	qpInitAttrSize    = 64              // sizeof(struct ibv_qp_init_attr)
	linkLayerEthernet = 2               // IBV_LINK_LAYER_ETHERNET
	qptRC             = 2               // IBV_QPT_RC
	sendSignaled      = 2               // IBV_SEND_SIGNALED
	wrRDMAWrite       = 0               // IBV_WR_RDMA_WRITE
	wrRDMARead        = 4               // IBV_WR_RDMA_READ
	maskState         = 1 << 0          // IBV_QP_STATE
	maskAccess        = 1 << 3          // IBV_QP_ACCESS_FLAGS
	maskPKey          = 1 << 4          // IBV_QP_PKEY_INDEX
	maskPort          = 1 << 5          // IBV_QP_PORT
	maskAV            = 1 << 7          // IBV_QP_AV
	maskPathMTU       = 1 << 8          // IBV_QP_PATH_MTU
	maskTimeout       = 1 << 9          // IBV_QP_TIMEOUT
	maskRetry         = 1 << 10         // IBV_QP_RETRY_CNT
	maskRNRRetry      = 1 << 11         // IBV_QP_RNR_RETRY
	maskRQPSN         = 1 << 12         // IBV_QP_RQ_PSN
	maskMaxRdAtomic   = 1 << 13         // IBV_QP_MAX_QP_RD_ATOMIC
	maskMinRNRTimer   = 1 << 15         // IBV_QP_MIN_RNR_TIMER
	maskSQPSN         = 1 << 16         // IBV_QP_SQ_PSN
	maskMaxDestRd     = 1 << 17         // IBV_QP_MAX_DEST_RD_ATOMIC
	maskDestQPN       = 1 << 20         // IBV_QP_DEST_QPN
	remoteRdAtomic    = 16              // outstanding RDMA reads per queue pair
	portActive        = 4               // IBV_PORT_ACTIVE
	_                 = portStateOffset // documents the layout
)

// Open loads libibverbs ("libibverbs.so.1" when path is empty).
func Open(path string) (*Lib, error) {
	if path == "" {
		path = "libibverbs.so.1"
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("no RDMA verbs library: %w", err)
	}
	l := &Lib{path: path, SysfsRoot: "/sys"}
	syms := []struct {
		dst      *uintptr
		name     string
		optional bool
	}{
		{&l.f.getDeviceList, "ibv_get_device_list", false}, {&l.f.freeDeviceList, "ibv_free_device_list", false},
		{&l.f.getDeviceName, "ibv_get_device_name", false}, {&l.f.openDevice, "ibv_open_device", false},
		{&l.f.closeDevice, "ibv_close_device", false}, {&l.f.allocPD, "ibv_alloc_pd", false},
		{&l.f.deallocPD, "ibv_dealloc_pd", false}, {&l.f.regMR, "ibv_reg_mr", false},
		{&l.f.regDmabufMR, "ibv_reg_dmabuf_mr", true}, {&l.f.deregMR, "ibv_dereg_mr", false},
		{&l.f.createCQ, "ibv_create_cq", false}, {&l.f.destroyCQ, "ibv_destroy_cq", false},
		{&l.f.createQP, "ibv_create_qp", false}, {&l.f.modifyQP, "ibv_modify_qp", false},
		{&l.f.destroyQP, "ibv_destroy_qp", false}, {&l.f.queryPort, "ibv_query_port", false},
		{&l.f.queryGID, "ibv_query_gid", false},
	}
	var missing []string
	for _, s := range syms {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			if !s.optional {
				missing = append(missing, s.name)
			}
			continue
		}
		*s.dst = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s lacks %s", path, strings.Join(missing, ", "))
	}
	return l, nil
}

//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func cstring(p uintptr) string {
	if p == 0 {
		return ""
	}
	b := unsafe.Slice((*byte)(cptr(p)), 256)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// errnoErr reads errno after a failed verbs call.
func errnoErr(op string, r uintptr) error {
	if r != 0 && int32(r) > 0 {
		return fmt.Errorf("%s: %w", op, syscall.Errno(int32(r)))
	}
	return fmt.Errorf("%s failed", op)
}

// DeviceNames lists the RDMA devices the library sees.
func (l *Lib) DeviceNames() ([]string, error) {
	var n int32
	list := call(l.f.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if list == 0 {
		return nil, errors.New("ibv_get_device_list failed")
	}
	defer call(l.f.freeDeviceList, list)
	devs := unsafe.Slice((*uintptr)(cptr(list)), n)
	names := make([]string, 0, n)
	for _, d := range devs {
		names = append(names, cstring(call(l.f.getDeviceName, d)))
	}
	return names, nil
}

// Device is an opened device port with one protection domain.
type Device struct {
	l        *Lib
	name     string
	port     int
	ctx, pd  uintptr
	lid      uint16
	mtu      int
	gid      [16]byte
	gidIndex int
	global   bool
	pollCQ   uintptr
	postSend uintptr
}

// OpenDevice opens port of device name.
func (l *Lib) OpenDevice(name string, port int) (*Device, error) {
	var n int32
	list := call(l.f.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if list == 0 {
		return nil, errors.New("ibv_get_device_list failed")
	}
	defer call(l.f.freeDeviceList, list)
	var dev uintptr
	for _, d := range unsafe.Slice((*uintptr)(cptr(list)), n) {
		if cstring(call(l.f.getDeviceName, d)) == name {
			dev = d
		}
	}
	if dev == 0 {
		return nil, fmt.Errorf("no RDMA device %q (%d present)", name, n)
	}
	d := &Device{l: l, name: name, port: port}
	if d.ctx = call(l.f.openDevice, dev); d.ctx == 0 {
		return nil, fmt.Errorf("ibv_open_device %s failed", name)
	}
	ops := unsafe.Slice((*uintptr)(unsafe.Add(cptr(d.ctx), ctxOpsOffset)), opsPostSend+1)
	d.pollCQ, d.postSend = ops[opsPollCQ], ops[opsPostSend]
	if err := d.queryPort(); err != nil {
		d.Close()
		return nil, err
	}
	if d.pd = call(l.f.allocPD, d.ctx); d.pd == 0 {
		d.Close()
		return nil, fmt.Errorf("ibv_alloc_pd on %s failed", name)
	}
	return d, nil
}

func (d *Device) queryPort() error {
	attr := make([]byte, 256)
	if r := call(d.l.f.queryPort, d.ctx, uintptr(d.port), uintptr(unsafe.Pointer(&attr[0]))); r != 0 {
		return errnoErr(fmt.Sprintf("ibv_query_port %s/%d", d.name, d.port), r)
	}
	if s := *(*uint32)(unsafe.Pointer(&attr[portStateOffset])); s != portActive {
		return fmt.Errorf("%s port %d is not active (state %d)", d.name, d.port, s)
	}
	d.mtu = int(*(*uint32)(unsafe.Pointer(&attr[portMTUOffset])))
	d.lid = *(*uint16)(unsafe.Pointer(&attr[portLIDOffset]))
	if attr[portLinkOffset] == linkLayerEthernet {
		idx, err := d.roceV2GIDIndex(int(*(*int32)(unsafe.Pointer(&attr[portGIDTblOffset]))))
		if err != nil {
			return err
		}
		d.gidIndex, d.global = idx, true
	}
	if r := call(d.l.f.queryGID, d.ctx, uintptr(d.port), uintptr(d.gidIndex), uintptr(unsafe.Pointer(&d.gid[0]))); r != 0 {
		return errnoErr("ibv_query_gid", r)
	}
	return nil
}

// roceV2GIDIndex finds the port's first RoCE v2 GID (sysfs gid_attrs/types).
func (d *Device) roceV2GIDIndex(n int) (int, error) {
	dir := filepath.Join(d.l.SysfsRoot, "class/infiniband", d.name, "ports", strconv.Itoa(d.port), "gid_attrs/types")
	for i := 0; i < n && i < 256; i++ {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(i)))
		if err == nil && strings.EqualFold(strings.TrimSpace(string(b)), "RoCE v2") {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s port %d has no RoCE v2 GID (looked in %s)", d.name, d.port, dir)
}

// Close frees the protection domain and closes the device.
func (d *Device) Close() error {
	if d.pd != 0 {
		call(d.l.f.deallocPD, d.pd)
		d.pd = 0
	}
	if d.ctx != 0 {
		call(d.l.f.closeDevice, d.ctx)
		d.ctx = 0
	}
	return nil
}

// MR is a memory registration.
type MR struct {
	d  *Device
	mr uintptr
}

// LKey is the local key.
func (m *MR) LKey() uint32 { return *(*uint32)(unsafe.Add(cptr(m.mr), mrLKeyOffset)) }

// RKey is the remote key peers use.
func (m *MR) RKey() uint32 { return *(*uint32)(unsafe.Add(cptr(m.mr), mrRKeyOffset)) }

// Close deregisters.
func (m *MR) Close() error {
	if r := call(m.d.l.f.deregMR, m.mr); r != 0 {
		return errnoErr("ibv_dereg_mr", r)
	}
	return nil
}

// RegisterMemory registers a virtual range (host memory, or GPU memory
// through the peer-memory module).
func (d *Device) RegisterMemory(addr, length uint64, access Access) (*MR, error) {
	mr := call(d.l.f.regMR, d.pd, uintptr(addr), uintptr(length), uintptr(access))
	if mr == 0 {
		return nil, fmt.Errorf("ibv_reg_mr of %d bytes on %s failed", length, d.name)
	}
	return &MR{d: d, mr: mr}, nil
}

// RegisterDMABuf registers part of a dma-buf.
func (d *Device) RegisterDMABuf(fd int, offset, length, iova uint64, access Access) (*MR, error) {
	if d.l.f.regDmabufMR == 0 {
		return nil, errors.New("libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than v34)")
	}
	mr := call(d.l.f.regDmabufMR, d.pd, uintptr(offset), uintptr(length), uintptr(iova), uintptr(fd), uintptr(access))
	if mr == 0 {
		return nil, fmt.Errorf("ibv_reg_dmabuf_mr of %d bytes on %s failed", length, d.name)
	}
	return &MR{d: d, mr: mr}, nil
}

// QP is a reliable-connected queue pair with its own completion queue.
type QP struct {
	d      *Device
	qp, cq uintptr
	psn    uint32
	mu     sync.Mutex
}

// CreateQP creates an RC queue pair in RESET.
func (d *Device) CreateQP(depth int) (*QP, error) {
	cq := call(d.l.f.createCQ, d.ctx, uintptr(depth), 0, 0, 0)
	if cq == 0 {
		return nil, fmt.Errorf("ibv_create_cq(%d) on %s failed", depth, d.name)
	}
	init := make([]byte, qpInitAttrSize)
	*(*uintptr)(unsafe.Pointer(&init[8])) = cq  // send_cq
	*(*uintptr)(unsafe.Pointer(&init[16])) = cq // recv_cq
	cap := unsafe.Slice((*uint32)(unsafe.Pointer(&init[32])), 5)
	cap[0], cap[1], cap[2], cap[3] = uint32(depth), 1, 1, 1 // max_send_wr, max_recv_wr, max_send_sge, max_recv_sge
	*(*uint32)(unsafe.Pointer(&init[52])) = qptRC
	qp := call(d.l.f.createQP, d.pd, uintptr(unsafe.Pointer(&init[0])))
	runtime.KeepAlive(init)
	if qp == 0 {
		call(d.l.f.destroyCQ, cq)
		return nil, fmt.Errorf("ibv_create_qp on %s failed", d.name)
	}
	q := &QP{d: d, qp: qp, cq: cq}
	q.psn = q.num() & 0xffffff
	return q, nil
}

func (q *QP) num() uint32 { return *(*uint32)(unsafe.Add(cptr(q.qp), qpNumOffset)) }

// Info is what the peer needs to connect.
func (q *QP) Info() ConnInfo {
	mtu := 256 << max(q.d.mtu-1, 0)
	return ConnInfo{QPN: q.num(), PSN: q.psn, LID: q.d.lid, GID: q.d.gid, MTU: mtu}
}

// State is the queue pair's state as last set.
func (q *QP) State() QPState { return QPState(*(*uint32)(unsafe.Add(cptr(q.qp), qpStateOffset))) }

func (q *QP) modify(attr []byte, mask int, what string) error {
	r := call(q.d.l.f.modifyQP, q.qp, uintptr(unsafe.Pointer(&attr[0])), uintptr(mask))
	runtime.KeepAlive(attr)
	if r != 0 {
		return errnoErr("ibv_modify_qp to "+what, r)
	}
	return nil
}

func mtuEnum(bytes int) uint32 {
	e := uint32(1)
	for b := 256; b < bytes && e < 5; b <<= 1 {
		e++
	}
	return e
}

// Connect moves the queue pair RESET → INIT → RTR → RTS towards remote.
func (q *QP) Connect(remote ConnInfo) error {
	u32 := func(a []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&a[off])) = v }
	a := make([]byte, qpAttrSize)
	u32(a, 0, uint32(QPInit))
	u32(a, 32, uint32(AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead))
	a[129] = byte(q.d.port)
	if err := q.modify(a, maskState|maskPKey|maskPort|maskAccess, "INIT"); err != nil {
		return err
	}
	a = make([]byte, qpAttrSize)
	u32(a, 0, uint32(QPRTR))
	u32(a, 8, min(mtuEnum(remote.MTU), uint32(q.d.mtu)))
	u32(a, 20, remote.PSN)
	u32(a, 28, remote.QPN)
	a[127] = remoteRdAtomic // max_dest_rd_atomic
	a[128] = 12             // min_rnr_timer
	ah := a[56:88]
	*(*uint16)(unsafe.Pointer(&ah[24])) = remote.LID
	ah[30] = byte(q.d.port)
	if q.d.global || remote.GID != ([16]byte{}) {
		copy(ah[0:16], remote.GID[:])
		ah[20] = byte(q.d.gidIndex) // sgid_index
		ah[21] = 64                 // hop_limit
		ah[29] = 1                  // is_global
	}
	if err := q.modify(a, maskState|maskAV|maskPathMTU|maskDestQPN|maskRQPSN|maskMaxDestRd|maskMinRNRTimer, "RTR"); err != nil {
		return err
	}
	a = make([]byte, qpAttrSize)
	u32(a, 0, uint32(QPRTS))
	u32(a, 24, q.psn)
	a[126] = remoteRdAtomic // max_rd_atomic
	a[130] = 14             // timeout: 4.096 us * 2^14 = 67 ms per try
	a[131] = 7              // retry_cnt
	a[132] = 7              // rnr_retry
	return q.modify(a, maskState|maskTimeout|maskRetry|maskRNRRetry|maskSQPSN|maskMaxRdAtomic, "RTS")
}

// Post posts signaled one-sided work requests, chained in one call.
func (q *QP) Post(wrs []WorkRequest) error {
	if len(wrs) == 0 {
		return nil
	}
	buf := make([]byte, len(wrs)*sendWRSize)
	sges := make([]byte, len(wrs)*16)
	for i, wr := range wrs {
		w, s := buf[i*sendWRSize:], sges[i*16:]
		*(*uint64)(unsafe.Pointer(&s[0])) = wr.LocalAddr
		*(*uint32)(unsafe.Pointer(&s[8])) = wr.Length
		*(*uint32)(unsafe.Pointer(&s[12])) = wr.LKey
		*(*uint64)(unsafe.Pointer(&w[0])) = wr.ID
		if i+1 < len(wrs) {
			*(*uintptr)(unsafe.Pointer(&w[8])) = uintptr(unsafe.Pointer(&buf[(i+1)*sendWRSize]))
		}
		*(*uintptr)(unsafe.Pointer(&w[16])) = uintptr(unsafe.Pointer(&s[0]))
		*(*int32)(unsafe.Pointer(&w[24])) = 1
		op := uint32(wrRDMAWrite)
		if wr.Op == OpRead {
			op = wrRDMARead
		}
		*(*uint32)(unsafe.Pointer(&w[28])) = op
		*(*uint32)(unsafe.Pointer(&w[32])) = sendSignaled
		*(*uint64)(unsafe.Pointer(&w[40])) = wr.RemoteAddr
		*(*uint32)(unsafe.Pointer(&w[48])) = wr.RKey
	}
	var bad uintptr
	q.mu.Lock()
	r := call(q.d.postSend, q.qp, uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&bad)))
	q.mu.Unlock()
	runtime.KeepAlive(buf)
	runtime.KeepAlive(sges)
	if r != 0 {
		return errnoErr("ibv_post_send", r)
	}
	return nil
}

// Poll reaps up to len(out) completions.
func (q *QP) Poll(out []Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	buf := make([]byte, len(out)*wcSize)
	q.mu.Lock()
	n := int(int32(call(q.d.pollCQ, q.cq, uintptr(len(out)), uintptr(unsafe.Pointer(&buf[0])))))
	q.mu.Unlock()
	if n < 0 {
		return 0, fmt.Errorf("ibv_poll_cq failed (%d)", n)
	}
	for i := 0; i < n; i++ {
		w := buf[i*wcSize:]
		out[i] = Completion{ID: *(*uint64)(unsafe.Pointer(&w[0])), Status: Status(*(*uint32)(unsafe.Pointer(&w[8]))),
			VendorErr: *(*uint32)(unsafe.Pointer(&w[16]))}
	}
	return n, nil
}

// Close moves the queue pair to ERR: outstanding work completes as flushed
// and can still be polled.
func (q *QP) Close() error {
	a := make([]byte, qpAttrSize)
	*(*uint32)(unsafe.Pointer(&a[0])) = uint32(QPErr)
	return q.modify(a, maskState, "ERR")
}

// Destroy frees the queue pair and its completion queue; nothing may poll it afterwards.
func (q *QP) Destroy() error {
	var err error
	if r := call(q.d.l.f.destroyQP, q.qp); r != 0 {
		err = errors.Join(err, errnoErr("ibv_destroy_qp", r))
	}
	if r := call(q.d.l.f.destroyCQ, q.cq); r != 0 {
		err = errors.Join(err, errnoErr("ibv_destroy_cq", r))
	}
	return err
}
