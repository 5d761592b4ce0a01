// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
)

// Register implements xgmi.Backend: GPU memory is mapped into this process
// (imported from a VMM fd or IPC handle when it belongs to another process)
// and checked against the runtime's view of its allocation; host memory is
// pinned when the runtime allows, so hipMemcpyAsync moves it without staging.
func (b *Backend) Register(_ context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	switch {
	case isAMDGPU(&d):
		m, out, err := b.registerGPU(d)
		if err != nil {
			return d, err
		}
		b.mu.Lock()
		b.regions[d.ID] = m
		b.mu.Unlock()
		return out, nil
	case d.Location.Kind == engines.LocationHost && d.Handles.Host != nil:
		m := &mapped{ordinal: -1, addr: hostAddr(d.Handles.Host)}
		// Pinning is an optimisation: memory the runtime will not pin (already
		// pinned elsewhere, limits) still moves, staged by the runtime.
		if b.ords.Count() > 0 && b.withOrdinal(0, func() error { return b.rt.HostRegister(uintptr(m.addr), d.Size) }) == nil {
			m.release = func() error { return b.withOrdinal(0, func() error { return b.rt.HostUnregister(uintptr(m.addr)) }) }
		}
		b.mu.Lock()
		b.regions[d.ID] = m
		b.mu.Unlock()
	}
	return d, nil
}

func (b *Backend) registerGPU(d engines.MemoryDesc) (*mapped, engines.MemoryDesc, error) {
	ord, err := b.ordinal(d.Location)
	if err != nil {
		return nil, d, err
	}
	m := &mapped{ordinal: ord}
	err = b.withOrdinal(ord, func() error {
		switch {
		case d.Handles.Ptr != 0:
			return b.adoptPointer(m, &d)
		case d.Handles.VMM != nil:
			return b.importVMM(m, &d)
		case len(d.Handles.IPC) == engines.IPCHandleSize:
			return b.openIPC(m, &d)
		}
		return fmt.Errorf("GPU memory %s has no pointer, VMM fd or IPC handle", d.ID)
	})
	if err != nil {
		return nil, d, fmt.Errorf("mapping %s on GPU %d: %w", d.ID, ord, err)
	}
	return m, d, nil
}

// adoptPointer checks that [Ptr, Ptr+Size) lies inside one allocation the
// runtime knows (an overrun on a GPU is silent corruption), and exports the
// handles other processes need to reach it. The bindings have no
// hipPointerGetAttributes, so which GPU holds the memory is the caller's word.
func (b *Backend) adoptPointer(m *mapped, d *engines.MemoryDesc) error {
	start := uint64(d.Handles.Ptr)
	base, size, err := b.rt.AddressRange(hip.DevicePtr(start))
	if err != nil {
		return fmt.Errorf("pointer %#x is not GPU memory HIP knows: %w", start, err)
	}
	if start+d.Size < start || start+d.Size > uint64(base)+size {
		return fmt.Errorf("region [%#x, +%d) runs past its allocation [%#x, +%d)", start, d.Size, uint64(base), size)
	}
	m.addr = start
	vmm := false
	if b.rt.HasVMM() {
		if h, vbase, vsize, err := b.rt.AllocationOf(hip.DevicePtr(start)); err == nil {
			vmm = true
			if d.Handles.VMM == nil {
				if fd, err := b.rt.ExportPosixFD(h); err == nil {
					// The fd travels with the descriptor and is closed with the region.
					f := os.NewFile(uintptr(fd), "vmm:"+string(d.ID))
					d.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, Offset: start - uint64(vbase), AllocSize: vsize}
					m.release = f.Close
				}
			}
			_ = b.rt.MemRelease(h)
		}
	}
	if !vmm && len(d.Handles.IPC) == 0 {
		// hipMalloc memory: a legacy IPC handle names the allocation holding it.
		if h, err := b.rt.IPCGetMemHandle(base); err == nil {
			d.Handles.IPC, d.Handles.IPCOffset = h[:], start-uint64(base)
		}
	}
	return nil
}

// importVMM imports an allocation another process exported as a POSIX fd
// (a dma-buf) and maps it readable and writable by every GPU that can reach it.
func (b *Backend) importVMM(m *mapped, d *engines.MemoryDesc) error {
	v := d.Handles.VMM
	if len(v.FDs) != 1 {
		// Multi-allocation regions (PyTorch's expandable segments) are mapped by the CUDA backend only.
		return fmt.Errorf("%w: memory spanning %d VMM allocations is not supported on AMD GPUs (register one allocation per region)",
			engines.ErrInvalid, len(v.FDs))
	}
	dev, err := b.rt.DeviceGet(m.ordinal)
	if err != nil {
		return err
	}
	h, err := b.rt.ImportPosixFD(int(v.FDs[0].Fd()))
	if err != nil {
		return err
	}
	g, err := b.rt.Granularity(dev, hip.HandleTypePosixFD)
	if err != nil {
		return errors.Join(err, b.rt.MemRelease(h))
	}
	if g == 0 || v.AllocSize%g != 0 {
		return errors.Join(fmt.Errorf("VMM allocation size %d is not a multiple of the granularity %d", v.AllocSize, g), b.rt.MemRelease(h))
	}
	ptr, err := b.rt.MapHandle(h, v.AllocSize, g, b.accessors(m.ordinal))
	if err != nil {
		return errors.Join(err, b.rt.MemRelease(h))
	}
	m.addr = uint64(ptr) + v.Offset
	size := v.AllocSize
	m.release = func() error {
		return b.withOrdinal(m.ordinal, func() error { return errors.Join(b.rt.UnmapRange(ptr, size), b.rt.MemRelease(h)) })
	}
	return nil
}

// accessors are the GPUs granted access to memory of GPU owner: itself and
// every GPU with peer access to it.
func (b *Backend) accessors(owner int) []hip.Device {
	od, _ := b.rt.DeviceGet(owner)
	devs := []hip.Device{od}
	for i := range b.ords.Count() {
		if i == owner {
			continue
		}
		d, err := b.rt.DeviceGet(i)
		if err != nil {
			continue
		}
		if ok, err := b.rt.CanAccessPeer(d, od); err == nil && ok {
			devs = append(devs, d)
		}
	}
	return devs
}

func (b *Backend) openIPC(m *mapped, d *engines.MemoryDesc) error {
	var h hip.IPCMemHandle
	copy(h[:], d.Handles.IPC)
	ptr, err := b.rt.IPCOpenMemHandle(h)
	if err != nil {
		return err
	}
	m.addr = uint64(ptr) + d.Handles.IPCOffset
	m.release = func() error { return b.withOrdinal(m.ordinal, func() error { return b.rt.IPCCloseMemHandle(ptr) }) }
	return nil
}

// enablePeer lets GPU from address GPU to's memory (once per pair).
func (b *Backend) enablePeer(from, to int) error {
	b.mu.Lock()
	err, done := b.peers[[2]int{from, to}]
	b.mu.Unlock()
	if done {
		return err
	}
	err = func() error {
		fd, err := b.rt.DeviceGet(from)
		if err != nil {
			return err
		}
		td, err := b.rt.DeviceGet(to)
		if err != nil {
			return err
		}
		ok, err := b.rt.CanAccessPeer(fd, td)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("no peer access between them (no XGMI link or PCIe P2P)")
		}
		return b.rt.WithDevice(fd, func() error { return b.rt.EnablePeerAccess(td) })
	}()
	b.mu.Lock()
	b.peers[[2]int{from, to}] = err
	b.mu.Unlock()
	return err
}

// withOrdinal runs fn with GPU ord current, restoring the caller's device.
func (b *Backend) withOrdinal(ord int, fn func() error) error {
	dev, err := b.rt.DeviceGet(ord)
	if err != nil {
		return err
	}
	return b.rt.WithDevice(dev, fn)
}

// Release implements xgmi.Backend.
func (b *Backend) Release(_ context.Context, d *engines.MemoryDesc) error {
	b.mu.Lock()
	m, ok := b.regions[d.ID]
	delete(b.regions, d.ID)
	b.mu.Unlock()
	if !ok || m.release == nil {
		return nil
	}
	if err := m.release(); err != nil {
		return fmt.Errorf("releasing %s: %w", d.ID, err)
	}
	return nil
}
