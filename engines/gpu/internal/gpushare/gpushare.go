// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Ordinals maps the agent's GPU locations to one runtime's device ordinals.
type Ordinals struct {
	// Runtime names the runtime in errors ("CUDA", "HIP").
	Runtime string
	// ByBus maps a lowercase PCI address to the runtime's ordinal.
	ByBus map[string]int
}

// Add records the ordinal of the device at PCI address bus.
func (o *Ordinals) Add(bus string, ordinal int) {
	if o.ByBus == nil {
		o.ByBus = map[string]int{}
	}
	o.ByBus[strings.ToLower(bus)] = ordinal
}

// Count is the number of devices the runtime showed.
func (o *Ordinals) Count() int { return len(o.ByBus) }

// Of maps a location to an ordinal: by PCI address when given (the agent's index and the runtime's order
// differ), else the index itself.
func (o *Ordinals) Of(loc engines.Location) (int, error) {
	if loc.BusID != "" {
		if n, ok := o.ByBus[strings.ToLower(loc.BusID)]; ok {
			return n, nil
		}
		return 0, fmt.Errorf("no %s device at PCI address %s", o.Runtime, loc.BusID)
	}
	if loc.Device < 0 || loc.Device >= len(o.ByBus) {
		return 0, fmt.Errorf("no %s device %d (%d visible)", o.Runtime, loc.Device, len(o.ByBus))
	}
	return loc.Device, nil
}

// Side is what a backend knows of one side of a pair: whether it mapped the region, and on which GPU (-1 for
// host memory).
type Side struct {
	Mapped  bool
	Ordinal int
}

// Claim is the pair rule of a GPU backend for vendor's GPUs: at least one side is that vendor's GPU memory,
// both sides are mapped by the backend, and two different GPUs can reach each other (enablePeer is asked, once
// per direction, by the caller's cache).
func Claim(vendor engines.Vendor, src, dst *engines.MemoryDesc, s, d Side, enablePeer func(from, to int) error) (bool, string) {
	isVendor := func(m *engines.MemoryDesc) bool {
		return m.Location.Kind == engines.LocationGPU && m.Location.Vendor == vendor
	}
	if !isVendor(src) && !isVendor(dst) {
		return false, fmt.Sprintf("neither side is %s GPU memory", strings.ToUpper(string(vendor)))
	}
	for _, c := range []struct {
		m    *engines.MemoryDesc
		side Side
	}{{src, s}, {dst, d}} {
		if !c.side.Mapped {
			if c.m.Location.Kind == engines.LocationGPU && !isVendor(c.m) {
				return false, fmt.Sprintf("%s is %s GPU memory", c.m.ID, c.m.Location.Vendor)
			}
			return false, fmt.Sprintf("%s is not reachable from this process (no pointer, VMM fd, IPC handle or host view)", c.m.ID)
		}
	}
	if s.Ordinal >= 0 && d.Ordinal >= 0 && s.Ordinal != d.Ordinal {
		if err := enablePeer(s.Ordinal, d.Ordinal); err != nil {
			return false, fmt.Sprintf("GPU %d cannot reach GPU %d directly: %v", s.Ordinal, d.Ordinal, err)
		}
	}
	return true, ""
}

// SpinUntil polls query until it reports the work done or fails, ctx ends, or deadline passes; finished says
// whether query answered (done or failed). Short copies are awaited this way on the caller's goroutine: a
// hand-off between threads costs more than they take. Between two queries it spins on the clock for gap:
// a query is a driver call, and back-to-back queries hold the driver from threads queueing the next copies.
func SpinUntil(ctx context.Context, deadline time.Time, gap time.Duration, query func() (bool, error)) (finished bool, err error) {
	for {
		done, err := query()
		if done || err != nil {
			return true, err
		}
		now := time.Now()
		if ctx.Err() != nil || !now.Before(deadline) {
			return false, nil
		}
		for until := now.Add(gap); time.Now().Before(until); {
		}
	}
}

// WriteFileAtomic writes b to path through a temporary file in the same directory, so a reader never sees a
// partial kernel image.
func WriteFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fxcopy-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// CachedImage returns the kernel image cached at path (empty: no cache) when one is there (origin "cache"),
// else what compile returns (origin compiled), written to path for the next start. cachePath is where the
// image now lies on disk, "" where nowhere: a read-only cache only costs a compile per start.
func CachedImage(path, compiled string, compile func() ([]byte, error)) (image []byte, origin, cachePath string, err error) {
	if path != "" {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b, "cache", path, nil
		}
	}
	if image, err = compile(); err != nil {
		return nil, "", "", err
	}
	if path != "" && WriteFileAtomic(path, image) == nil {
		cachePath = path
	}
	return image, compiled, cachePath, nil
}
