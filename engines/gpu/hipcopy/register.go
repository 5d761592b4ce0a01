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
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// Register implements xgmi.Backend: GPU memory is mapped into this process
// (imported from a VMM fd or IPC handle when it belongs to another process)
// and checked against the runtime's view of its allocation; host memory is
// pinned when the runtime allows, so hipMemcpyAsync moves it without staging.
func (b *Backend) Register(_ context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	switch {
	case b.reg.Owns(&d):
		m, out, err := b.registerGPU(d)
		if err != nil {
			return d, err
		}
		b.reg.Put(d.ID, m)
		return out, nil
	case d.Location.Kind == engines.LocationHost && d.Handles.Host != nil:
		b.reg.PutHost(&d, b.rt.HostRegister, b.rt.HostUnregister)
	}
	return d, nil
}

func (b *Backend) registerGPU(d engines.MemoryDesc) (*mapped, engines.MemoryDesc, error) {
	ord, err := b.ordinal(d.Location)
	if err != nil {
		return nil, d, err
	}
	m := &mapped{Ordinal: ord}
	err = b.reg.MapGPU(m, &d,
		func() error { return b.adoptPointer(m, &d) },
		func() error { return b.importVMM(m, &d) },
		func() error { return gpushare.OpenIPC(b.reg, b.rt, m, &d) })
	if err != nil {
		return nil, d, err
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
	m.Addr = start
	vmm := false
	if b.rt.HasVMM() {
		if h, vbase, vsize, err := b.rt.AllocationOf(hip.DevicePtr(start)); err == nil {
			vmm = true
			if d.Handles.VMM == nil {
				if fd, err := b.rt.ExportPosixFD(h); err == nil {
					f := gpushare.ExportedFD(fd, d.ID)
					d.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, Offset: start - uint64(vbase), AllocSize: vsize}
					m.Release = f.Close
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
	dev, err := b.rt.DeviceGet(m.Ordinal)
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
	ptr, err := b.rt.MapHandle(h, v.AllocSize, g, b.reg.Accessors(m.Ordinal))
	if err != nil {
		return errors.Join(err, b.rt.MemRelease(h))
	}
	m.Addr = uint64(ptr) + v.Offset
	size := v.AllocSize
	b.reg.ReleaseIn(m, func() error { return errors.Join(b.rt.UnmapRange(ptr, size), b.rt.MemRelease(h)) })
	return nil
}

// Release implements xgmi.Backend.
func (b *Backend) Release(_ context.Context, d *engines.MemoryDesc) error { return b.reg.Release(d.ID) }
