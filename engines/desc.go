// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Limits on descriptor fields, so a descriptor from a peer cannot make us allocate much.
const (
	maxIDLen     = 256
	maxNodeLen   = 253
	maxBusIDLen  = 32
	maxDomainLen = 255
	maxDeviceLen = 64
	maxAddrLen   = 255
	maxRDMAKeys  = 16
	maxGPUIndex  = 1023
	// IPCHandleSize is the size of a CUDA/HIP legacy IPC memory handle.
	IPCHandleSize = 64
)

// Validate checks a descriptor's fields. It is called on Register and Import and by the wire codec.
func (d *MemoryDesc) Validate() error {
	if err := checkName("memory id", string(d.ID), maxIDLen); err != nil {
		return err
	}
	if err := checkName("node", d.Node, maxNodeLen); err != nil {
		return err
	}
	if d.Size == 0 {
		return fmt.Errorf("%w: memory %s has size 0", ErrInvalid, d.ID)
	}
	switch d.Location.Kind {
	case LocationHost:
		if d.Location.Device != 0 || d.Location.Vendor != "" || d.Location.BusID != "" {
			return fmt.Errorf("%w: host memory %s names a GPU (device %d, vendor %q, bus %q)",
				ErrInvalid, d.ID, d.Location.Device, d.Location.Vendor, d.Location.BusID)
		}
		if d.FabricDomain != "" {
			return fmt.Errorf("%w: host memory %s has a fabric domain", ErrInvalid, d.ID)
		}
	case LocationGPU:
		if d.Location.Device < 0 || d.Location.Device > maxGPUIndex {
			return fmt.Errorf("%w: memory %s: GPU index %d out of range", ErrInvalid, d.ID, d.Location.Device)
		}
		if d.Location.Vendor != VendorNVIDIA && d.Location.Vendor != VendorAMD {
			return fmt.Errorf("%w: memory %s: unknown GPU vendor %q", ErrInvalid, d.ID, d.Location.Vendor)
		}
		if d.Location.BusID != "" {
			if err := checkName("bus id", d.Location.BusID, maxBusIDLen); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: memory %s: unknown location kind %d", ErrInvalid, d.ID, d.Location.Kind)
	}
	if d.FabricDomain != "" {
		if !strings.HasPrefix(d.FabricDomain, "ualink:") && !strings.HasPrefix(d.FabricDomain, "nvlink:") {
			return fmt.Errorf("%w: memory %s: fabric domain %q is neither ualink: nor nvlink:", ErrInvalid, d.ID, d.FabricDomain)
		}
		if err := checkName("fabric domain", d.FabricDomain, maxDomainLen); err != nil {
			return err
		}
	}
	return d.Handles.validate(d)
}

func (h *Handles) validate(d *MemoryDesc) error {
	if h.Host != nil && uint64(len(h.Host)) != d.Size {
		return fmt.Errorf("%w: memory %s: host view is %d bytes, size is %d", ErrInvalid, d.ID, len(h.Host), d.Size)
	}
	if h.Host != nil && d.Location.Kind != LocationHost {
		return fmt.Errorf("%w: memory %s: host view on GPU memory", ErrInvalid, d.ID)
	}
	if h.VMM != nil {
		if err := h.VMM.validate(d.Size); err != nil {
			return fmt.Errorf("%w: memory %s: %v", ErrInvalid, d.ID, err)
		}
	}
	if len(h.IPC) != 0 && len(h.IPC) != IPCHandleSize {
		return fmt.Errorf("%w: memory %s: IPC handle is %d bytes, want %d", ErrInvalid, d.ID, len(h.IPC), IPCHandleSize)
	}
	if len(h.IPC) == 0 && h.IPCOffset != 0 {
		return fmt.Errorf("%w: memory %s: IPC offset without IPC handle", ErrInvalid, d.ID)
	}
	if h.Fabric != nil && !fitsIn(h.Fabric.Offset, d.Size, h.Fabric.AllocSize) {
		return fmt.Errorf("%w: memory %s: region [%d, +%d) outside its fabric allocation of %d bytes",
			ErrInvalid, d.ID, h.Fabric.Offset, d.Size, h.Fabric.AllocSize)
	}
	if len(h.RDMA) > maxRDMAKeys {
		return fmt.Errorf("%w: memory %s: %d RDMA keys, at most %d", ErrInvalid, d.ID, len(h.RDMA), maxRDMAKeys)
	}
	for _, k := range h.RDMA {
		if err := checkName("RDMA device", k.Device, maxDeviceLen); err != nil {
			return err
		}
		if k.Addr+d.Size < k.Addr {
			return fmt.Errorf("%w: memory %s: RDMA address %#x + size overflows", ErrInvalid, d.ID, k.Addr)
		}
	}
	if h.TCP != "" {
		if err := checkHostPort(h.TCP); err != nil {
			return fmt.Errorf("%w: memory %s: TCP endpoint: %v", ErrInvalid, d.ID, err)
		}
	}
	return nil
}

// validate checks the fds are there, the region lies inside their span and every allocation holds part of it
// (so a caller cannot make the agent hold and map allocations the region does not use).
func (v *VMMHandle) validate(size uint64) error {
	span, ok := v.Span()
	if !ok {
		return fmt.Errorf("VMM handle of %d allocations of %d bytes (want 1 to %d of a positive size that do not overflow)",
			len(v.FDs), v.AllocSize, MaxVMMAllocations)
	}
	for i, f := range v.FDs {
		if f == nil {
			return fmt.Errorf("VMM handle without fd for allocation %d", i)
		}
	}
	if !fitsIn(v.Offset, size, span) {
		return fmt.Errorf("region [%d, +%d) outside its %d VMM allocations of %d bytes", v.Offset, size, len(v.FDs), v.AllocSize)
	}
	if n := uint64(len(v.FDs)); n > 1 && (v.Offset >= v.AllocSize || v.Offset+size <= (n-1)*v.AllocSize) {
		return fmt.Errorf("region [%d, +%d) leaves some of its %d VMM allocations of %d bytes unused (pass only the ones it spans)",
			v.Offset, size, n, v.AllocSize)
	}
	return nil
}

// fitsIn reports whether [off, off+size) lies inside [0, total).
func fitsIn(off, size, total uint64) bool {
	return size <= total && off <= total-size
}

func checkName(what, s string, max int) error {
	if s == "" || len(s) > max {
		return fmt.Errorf("%w: %s %q must be 1 to %d bytes", ErrInvalid, what, s, max)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("%w: %s %q has a byte outside printable ASCII", ErrInvalid, what, s)
		}
	}
	return nil
}

func checkHostPort(addr string) error {
	if len(addr) > maxAddrLen {
		return fmt.Errorf("address longer than %d bytes", maxAddrLen)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("address %q has no host", addr)
	}
	if err := checkName("host", host, maxAddrLen); err != nil {
		return err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || strconv.FormatUint(p, 10) != port {
		return fmt.Errorf("address %q: port must be 1-65535", addr)
	}
	return nil
}

// Remote returns the descriptor as another node sees it: process-local handles (Ptr, Host, VMM) removed.
func (d MemoryDesc) Remote() MemoryDesc {
	d.Handles.Ptr = 0
	d.Handles.Host = nil
	d.Handles.VMM = nil
	return d
}
