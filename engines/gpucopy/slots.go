package gpucopy

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/cuda"
)

// slot is descriptor staging for one in-flight launch: pinned host memory the
// host writes and device memory the kernel reads.
type slot struct {
	hostPtr uintptr
	devPtr  cuda.DevicePtr
	size    uint64
}

func (s *slot) host() []byte {
	return unsafe.Slice((*byte)(cuda.HostPointer(s.hostPtr)), s.size)
}

// slotPool recycles staging slots; a slot goes back only once the launch that
// read it has completed.
type slotPool struct {
	drv  *cuda.Driver
	mu   sync.Mutex
	free []*slot
}

const minSlotSize = 64 << 10

// get returns a slot of at least n bytes; the Copier's context must be current.
func (p *slotPool) get(n uint64) (*slot, error) {
	p.mu.Lock()
	for i, s := range p.free {
		if s.size >= n {
			p.free = append(p.free[:i], p.free[i+1:]...)
			p.mu.Unlock()
			return s, nil
		}
	}
	p.mu.Unlock()
	size := uint64(minSlotSize)
	for size < n {
		size *= 2
	}
	h, err := p.drv.MemHostAlloc(size)
	if err != nil {
		return nil, err
	}
	d, err := p.drv.MemAlloc(size)
	if err != nil {
		return nil, errors.Join(err, p.drv.MemFreeHost(h))
	}
	return &slot{hostPtr: h, devPtr: d, size: size}, nil
}

func (p *slotPool) put(s *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, s)
}

// close frees every idle slot; the Copier's context must be current.
func (p *slotPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.free {
		errs = append(errs, p.drv.MemFree(s.devPtr), p.drv.MemFreeHost(s.hostPtr))
	}
	p.free = nil
	return errors.Join(errs...)
}
