// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
)

// imexChannels is where the NVIDIA driver exposes IMEX channels; without one
// a process may not create or import fabric memory.
const imexChannels = "/dev/nvidia-caps-imex-channels"

// waitAfterCancel bounds how long Copy waits for queued GPU work after its
// context ended (a launched kernel cannot be recalled).
const waitAfterCancel = 30 * time.Second

// CUDARuntime is the NVIDIA runtime: VMM fabric handles (IMEX) and the copy
// kernels of package cudacopy.
type CUDARuntime struct {
	drv       *cuda.Driver
	opts      cudacopy.Options
	available bool
	reason    string

	mu      sync.Mutex
	copiers map[int]*cudacopy.Copier
}

// NewCUDARuntime probes whether this node can create fabric memory (the one
// test that is conclusive: a small cuMemCreate with the fabric handle type)
// and prepares copiers per GPU on first use.
func NewCUDARuntime(drv *cuda.Driver, opts cudacopy.Options) *CUDARuntime {
	r := &CUDARuntime{drv: drv, opts: opts, copiers: map[int]*cudacopy.Copier{}}
	r.available, r.reason = r.probe()
	return r
}

func (r *CUDARuntime) probe() (bool, string) {
	n, err := r.drv.DeviceCount()
	if err != nil || n == 0 {
		return false, fmt.Sprintf("no CUDA device (%d, %v)", n, err)
	}
	dev, err := r.drv.DeviceGet(0)
	if err != nil {
		return false, err.Error()
	}
	if v, err := r.drv.DeviceAttribute(dev, cuda.AttrHandleTypeFabricSupported); err != nil || v == 0 {
		return false, fmt.Sprintf("GPU 0 does not support fabric handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED=%d, %v)", v, err)
	}
	c, err := r.copier(0)
	if err != nil {
		return false, err.Error()
	}
	var why string
	err = r.drv.WithContext(c.Context(), func() error {
		g, err := r.drv.Granularity(dev, cuda.HandleTypeFabric)
		if err != nil {
			return err
		}
		h, err := r.drv.MemCreate(dev, g, cuda.HandleTypeFabric)
		if err != nil {
			return err
		}
		return r.drv.MemRelease(h)
	})
	if err == nil {
		return true, ""
	}
	why = "cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC failed: " + errName(err)
	if _, serr := os.Stat(imexChannels); serr != nil {
		why += " (no IMEX channel: " + imexChannels + " is absent; the node needs nvidia-imex and a channel for the agent)"
	}
	return false, why
}

func errName(err error) string {
	var ce *cuda.Error
	if errors.As(err, &ce) && ce.Name != "" {
		return ce.Name
	}
	return err.Error()
}

// Available implements Runtime.
func (r *CUDARuntime) Available() (bool, string) { return r.available, r.reason }

func (r *CUDARuntime) copier(ord int) (*cudacopy.Copier, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.copiers[ord]; ok {
		return c, nil
	}
	c, err := cudacopy.NewCopier(r.drv, ord, r.opts)
	if err != nil {
		return nil, err
	}
	r.copiers[ord] = c
	return c, nil
}

// ordinal finds the CUDA ordinal of a location (by PCI address when known).
func (r *CUDARuntime) ordinal(loc engines.Location) (int, error) {
	if loc.BusID == "" {
		return loc.Device, nil
	}
	n, err := r.drv.DeviceCount()
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		dev, err := r.drv.DeviceGet(i)
		if err != nil {
			return 0, err
		}
		if bus, err := r.drv.DevicePCIBusID(dev); err == nil && strings.EqualFold(bus, loc.BusID) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("no CUDA device at PCI address %s", loc.BusID)
}

// Local implements Runtime: the region's pointer, checked against the driver.
func (r *CUDARuntime) Local(d *engines.MemoryDesc) (uint64, int, error) {
	if d.Handles.Ptr == 0 {
		return 0, 0, errors.New("no device pointer in this process")
	}
	ord, err := r.ordinal(d.Location)
	if err != nil {
		return 0, 0, err
	}
	c, err := r.copier(ord)
	if err != nil {
		return 0, 0, err
	}
	p := uint64(d.Handles.Ptr)
	err = r.drv.WithContext(c.Context(), func() error {
		info, err := r.drv.PointerGetInfo(p)
		if err != nil {
			return err
		}
		if info.Type != cuda.MemoryTypeDevice || info.Ordinal != ord {
			return fmt.Errorf("pointer %#x is not device memory of GPU %d", p, ord)
		}
		if p+d.Size > info.RangeStart+info.RangeSize {
			return fmt.Errorf("region [%#x, +%d) runs past its allocation", p, d.Size)
		}
		return nil
	})
	return p, ord, err
}

// Export implements Runtime.
func (r *CUDARuntime) Export(d *engines.MemoryDesc) (engines.FabricHandle, error) {
	var out engines.FabricHandle
	_, ord, err := r.Local(d)
	if err != nil {
		return out, err
	}
	c, err := r.copier(ord)
	if err != nil {
		return out, err
	}
	p := cuda.DevicePtr(d.Handles.Ptr)
	err = r.drv.WithContext(c.Context(), func() error {
		types, err := r.drv.PointerHandleTypes(uint64(p))
		if err != nil {
			return err
		}
		if types&cuda.HandleTypeFabric == 0 {
			return fmt.Errorf("%w: its allocation's handle types are %#x (allocate with cuMemCreate and CU_MEM_HANDLE_TYPE_FABRIC)", ErrNotExportable, types)
		}
		h, base, size, err := r.drv.AllocationOf(p)
		if err != nil {
			return err
		}
		defer r.drv.MemRelease(h)
		tok, err := r.drv.ExportFabric(h)
		if err != nil {
			return err
		}
		out = engines.FabricHandle{Token: tok, Offset: uint64(p - base), AllocSize: size}
		return nil
	})
	return out, err
}

// Map implements Runtime.
func (r *CUDARuntime) Map(gpu int, fh engines.FabricHandle) (uint64, func() error, error) {
	c, err := r.copier(gpu)
	if err != nil {
		return 0, nil, err
	}
	var ptr cuda.DevicePtr
	var h cuda.AllocHandle
	err = r.drv.WithContext(c.Context(), func() error {
		var err error
		if h, err = r.drv.ImportFabric(cuda.FabricHandle(fh.Token)); err != nil {
			return err
		}
		g, err := r.drv.Granularity(c.Device(), cuda.HandleTypeFabric)
		if err != nil {
			return errors.Join(err, r.drv.MemRelease(h))
		}
		if fh.AllocSize == 0 || fh.AllocSize%g != 0 {
			return errors.Join(fmt.Errorf("allocation size %d is not a multiple of the granularity %d", fh.AllocSize, g), r.drv.MemRelease(h))
		}
		if ptr, err = r.drv.MapHandle(h, fh.AllocSize, g, []cuda.Device{c.Device()}); err != nil {
			return errors.Join(err, r.drv.MemRelease(h))
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	unmap := func() error {
		return r.drv.WithContext(c.Context(), func() error {
			return errors.Join(r.drv.UnmapRange(ptr, fh.AllocSize), r.drv.MemRelease(h))
		})
	}
	return uint64(ptr), unmap, nil
}

// Copy implements Runtime.
func (r *CUDARuntime) Copy(ctx context.Context, gpu int, segs []Segment) error {
	c, err := r.copier(gpu)
	if err != nil {
		return err
	}
	gs := make([]cudacopy.Segment, len(segs))
	for i, s := range segs {
		gs[i] = cudacopy.Segment{Dst: s.Dst, Src: s.Src, Size: s.Size}
	}
	p, err := c.Submit(gs)
	if err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		if ctx.Err() == nil {
			return err
		}
		wctx, cancel := context.WithTimeout(context.Background(), waitAfterCancel)
		defer cancel()
		if werr := p.Wait(wctx); werr != nil && wctx.Err() != nil {
			return fmt.Errorf("%w; the GPU copy did not finish within %v afterwards", ctx.Err(), waitAfterCancel)
		}
		return ctx.Err()
	}
	return nil
}

// Close releases the copiers.
func (r *CUDARuntime) Close() error {
	r.mu.Lock()
	cs := r.copiers
	r.copiers = map[int]*cudacopy.Copier{}
	r.mu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
