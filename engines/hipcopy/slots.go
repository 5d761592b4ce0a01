package hipcopy

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/hip"
)

// slot is descriptor staging for one in-flight launch: pinned, mapped host
// memory the host writes and the kernel reads in place (HIP shares one
// address space with the host, so the host address is the kernel's).
type slot struct {
	ptr  uintptr
	size uint64
}

func (s *slot) host() []byte {
	return unsafe.Slice((*byte)(hip.HostPointer(s.ptr)), s.size)
}

// slotPool recycles staging slots; a slot goes back only once the launch that
// read it has completed.
type slotPool struct {
	rt   *hip.Runtime
	mu   sync.Mutex
	free []*slot
}

const minSlotSize = 64 << 10

// get returns a slot of at least n bytes.
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
	h, err := p.rt.HostMalloc(size)
	if err != nil {
		return nil, err
	}
	return &slot{ptr: h, size: size}, nil
}

func (p *slotPool) put(s *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, s)
}

// close frees every idle slot.
func (p *slotPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.free {
		errs = append(errs, p.rt.HostFree(s.ptr))
	}
	p.free = nil
	return errors.Join(errs...)
}
