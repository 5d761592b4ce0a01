// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// Segment is one copy between two addresses a GPU can reach, in the unified
// address space HIP shares with the host.
type Segment = scatter.Segment

// Route says which hardware may touch a submission's memory.
type Route int

const (
	// RouteAuto: the kernel for scattered items, hipMemcpyAsync for large ones.
	RouteAuto Route = iota
	// RouteRuntime: hipMemcpyAsync only, for memory the kernel cannot address
	// (host memory, whose device-side address the bindings cannot ask for).
	RouteRuntime
)

// Copier executes copies on one GPU's stream.
type Copier struct {
	rt      *hip.Runtime
	dev     hip.Device
	cus     int
	stream  hip.Stream
	kernels *Kernels
	mode    Mode
	reason  string
	opts    Options

	mu    sync.Mutex // serializes submissions on the stream
	slots *gpushare.Staging[*slot]

	events gpushare.Events[hip.Event] // idle completion events
}

// NewCopier creates a stream on GPU ordinal and loads the kernels for its gfx
// target (Options.Archs); when they cannot be loaded every item becomes its
// own hipMemcpyAsync and Reason says why.
func NewCopier(rt *hip.Runtime, ordinal int, opts Options) (*Copier, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	dev, err := rt.DeviceGet(ordinal)
	if err != nil {
		return nil, fmt.Errorf("opening GPU %d: %w", ordinal, err)
	}
	c := &Copier{rt: rt, dev: dev, opts: opts}
	c.slots = newSlots(rt)
	err = rt.WithDevice(dev, func() error {
		if c.cus, err = rt.DeviceAttribute(dev, hip.AttrMultiprocessorCount); err != nil {
			return err
		}
		if c.stream, err = rt.StreamCreate(); err != nil {
			return err
		}
		c.chooseMode()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("setting up GPU %d: %w", ordinal, err)
	}
	return c, nil
}

// chooseMode loads the kernels; the device must be current.
func (c *Copier) chooseMode() {
	if c.opts.Force == ModePerItem {
		c.mode, c.reason = ModePerItem, "forced by options"
		return
	}
	arch := ""
	if bus, err := c.rt.DevicePCIBusID(c.dev); err == nil {
		arch = c.opts.Archs[strings.ToLower(bus)]
	}
	k, err := LoadKernels(c.rt, c.opts.RTC, arch, c.opts.CacheDir)
	if err != nil {
		c.mode, c.reason = ModePerItem, err.Error()
		return
	}
	c.kernels, c.mode = k, ModeKernel
}

// Mode is how scattered items move; Reason says why it is not ModeKernel.
func (c *Copier) Mode() Mode { return c.mode }

// Reason explains a fallback from the kernel ("" when the kernel is used).
func (c *Copier) Reason() string { return c.reason }

// Kernels describes the loaded kernels (nil in ModePerItem).
func (c *Copier) Kernels() *Kernels { return c.kernels }

// Device is the Copier's GPU.
func (c *Copier) Device() hip.Device { return c.dev }

// Stream is the stream copies are queued on.
func (c *Copier) Stream() hip.Stream { return c.stream }

// Submit queues segs on the stream and returns without waiting for the GPU.
// Every segment must be non-empty and reachable from this GPU.
func (c *Copier) Submit(segs []Segment, route Route) (*Pending, error) {
	if len(segs) == 0 {
		return nil, errors.New("nothing to copy")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &Pending{c: c}
	p.end.Start()
	var largest uint64
	for _, s := range segs {
		p.bytes += s.Size
		largest = max(largest, s.Size)
	}
	small, big := segs, []Segment(nil)
	switch {
	case route == RouteRuntime || c.mode != ModeKernel:
		small, big = nil, segs
	case largest >= c.opts.CopyEngineMin:
		small, big = scatter.SplitBySize(segs, c.opts.CopyEngineMin)
	}
	err := c.rt.WithDevice(c.dev, func() error {
		// Host work first (descriptors), so a device timing covers only the GPU.
		var layout scatter.Layout
		if len(small) > 0 {
			var err error
			if layout, err = scatter.Plan(small, c.opts.MaxPiece); err != nil {
				return err
			}
			if p.slot, err = c.slots.Get(uint64(layout.Bytes())); err != nil {
				return err
			}
			scatter.Write(p.slot.host(), small, layout, c.opts.MaxPiece)
		}
		if c.opts.TimeDevice {
			if err := c.record(&p.start, true); err != nil {
				return err
			}
		}
		for _, s := range big {
			if err := c.rt.MemcpyAsync(s.Dst, s.Src, s.Size, c.stream); err != nil {
				return err
			}
		}
		if len(small) > 0 {
			if err := c.launch(layout, uint64(p.slot.ptr)); err != nil {
				return err
			}
		}
		p.queued = time.Now()
		return c.record(&p.event, c.opts.TimeDevice)
	})
	if err != nil {
		// Work already queued may still run; wait it out so the staging slot and
		// the caller's buffers are not reused under it.
		_ = c.rt.WithDevice(c.dev, func() error { return c.rt.StreamSynchronize(c.stream) })
		c.release(p)
		return nil, fmt.Errorf("queueing %d segments on GPU %d: %w", len(segs), c.dev, err)
	}
	return p, nil
}

// record takes an idle event (creating one costs a runtime call per
// submission), stores it in *ev and records it on the stream.
func (c *Copier) record(ev *hip.Event, timing bool) error {
	if e, ok := c.events.Get(timing); ok {
		*ev = e
	}
	if *ev == 0 {
		e, err := c.rt.EventCreate(timing)
		if err != nil {
			return err
		}
		*ev = e
	}
	return c.rt.EventRecord(*ev, c.stream)
}

func (c *Copier) release(p *Pending) {
	c.events.Put(p.start, true)
	c.events.Put(p.event, c.opts.TimeDevice)
	if p.slot != nil {
		c.slots.Put(p.slot)
	}
}

// Close waits for queued work and frees the stream, events, staging and kernels.
func (c *Copier) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rt.WithDevice(c.dev, func() error {
		errs := []error{c.rt.StreamSynchronize(c.stream), c.slots.Close(), c.rt.StreamDestroy(c.stream)}
		errs = append(errs, c.events.Destroy(c.rt.EventDestroy)...)
		if c.kernels != nil {
			errs = append(errs, c.rt.ModuleUnload(c.kernels.module))
		}
		return errors.Join(errs...)
	})
}
