// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"fmt"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
)

// Mode is how a Copier moves scattered items.
type Mode string

// Copy modes.
const (
	// ModeKernel: one scatter-kernel launch per submission.
	ModeKernel Mode = "kernel"
	// ModePerItem: one hipMemcpyAsync per item (HIP has no batch copy).
	ModePerItem Mode = "runtime-per-item"
)

// Options tune a Backend and its Copiers; the zero value is the production default.
type Options struct {
	// RTC compiles the kernels; nil means hipRTC is not available.
	RTC *hip.RTC
	// CacheDir holds compiled kernels between runs; empty disables the cache.
	CacheDir string
	// Archs maps a GPU's lowercase PCI address to its gfx target ("gfx942"),
	// as KFD topology reports it: the bindings cannot read gcnArchName. A GPU
	// missing here is compiled for as hipRTC's current device, uncached.
	Archs map[string]string
	// CopyEngineMin sends items at least this large to hipMemcpyAsync (the
	// SDMA/blit path) instead of the kernel (default 16 MiB, as on CUDA).
	CopyEngineMin uint64
	// MaxPiece cuts items into pieces of at most this many bytes for the
	// kernel, one wavefront each (default 32 KiB; a power of two).
	MaxPiece uint64
	// Force picks ModePerItem instead of the kernel (benchmarks, tests).
	Force Mode
	// TimeDevice records GPU-side timing of every submission (Pending.DeviceTime).
	TimeDevice bool
	// SpinWait is how long Wait polls the completion event on the caller's
	// goroutine before handing over to a thread blocked in the runtime
	// (default 200µs).
	SpinWait time.Duration
	// SleepRate (bytes/s) extends the polling for large copies by
	// bytes/SleepRate; keep it above the GPU's fastest copy (default 6e12:
	// an MI300X's HBM3 peaks at 5.3e12 B/s).
	SleepRate float64
	// Observe, when set, receives every completed copy of a Backend.
	Observe func(CopyStats)
}

// CopyStats describes one completed Backend copy.
type CopyStats struct {
	Ordinal  int
	Segments int
	Bytes    uint64
	Mode     Mode
	// Device is the GPU time (Options.TimeDevice), Host the time Copy took.
	Device, Host time.Duration
}

const (
	defaultCopyEngineMin = 16 << 20
	defaultMaxPiece      = 32 << 10
	defaultSpinWait      = 200 * time.Microsecond
	defaultSleepRate     = 6e12
	threadsPerBlock      = 256
	lanes                = 64 // wavefront width on CDNA (FX_LANES in copy.hip)
	wavesPerBlock        = threadsPerBlock / lanes
	// blocksPerCU: a CDNA2/3 compute unit holds 32 wavefronts (4 SIMDs x 8),
	// eight blocks of 256 threads.
	blocksPerCU = 8
)

// withDefaults fills zero fields and checks the rest.
func (o Options) withDefaults() (Options, error) {
	if o.CopyEngineMin == 0 {
		o.CopyEngineMin = defaultCopyEngineMin
	}
	if o.MaxPiece == 0 {
		o.MaxPiece = defaultMaxPiece
	}
	if o.SpinWait <= 0 {
		o.SpinWait = defaultSpinWait
	}
	if o.SleepRate <= 0 {
		o.SleepRate = defaultSleepRate
	}
	if o.MaxPiece&(o.MaxPiece-1) != 0 {
		return o, fmt.Errorf("piece size %d is not a power of two", o.MaxPiece)
	}
	switch o.Force {
	case "", ModeKernel, ModePerItem:
	default:
		return o, fmt.Errorf("unknown copy mode %q", o.Force)
	}
	return o, nil
}
