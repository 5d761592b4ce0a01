// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"unsafe"
)

// GraphExec is a CUgraphExec: an instantiated graph, launched as one unit.
type GraphExec uintptr

// captureModeRelaxed (CU_STREAM_CAPTURE_MODE_RELAXED): other threads' driver calls during the capture are not
// refused, as they would be in the global mode.
const captureModeRelaxed = 2

// HasGraphs reports whether the driver exports what CaptureCopy and GraphLaunch need.
func (d *Driver) HasGraphs() bool { return d.f.graphLaunch != 0 }

// CaptureCopy records one cuMemcpyAsync of n bytes from src to dst on s (a stream with nothing else being
// captured) and instantiates it: launching the result queues the same copy without the driver looking the two
// addresses up again. The addresses must stay mapped as they are for as long as the result is launched.
func (d *Driver) CaptureCopy(dst, src, n uint64, s Stream) (GraphExec, error) {
	if !d.HasGraphs() {
		return 0, notExported("cuGraphLaunch", ErrSymbolNotFoundInDriver)
	}
	if err := d.call("cuStreamBeginCapture", d.f.streamBeginCapture, uintptr(s), captureModeRelaxed); err != nil {
		return 0, err
	}
	copyErr := d.MemcpyAsync(dst, src, n, s)
	var g uintptr
	if err := d.call("cuStreamEndCapture", d.f.streamEndCapture, uintptr(s), uintptr(unsafe.Pointer(&g))); err != nil {
		return 0, errors.Join(copyErr, err)
	}
	if copyErr != nil {
		return 0, errors.Join(copyErr, d.call("cuGraphDestroy", d.f.graphDestroy, g))
	}
	var x GraphExec
	err := d.call("cuGraphInstantiate", d.f.graphInstantiate, uintptr(unsafe.Pointer(&x)), g, 0)
	// The instantiated graph does not need its template.
	if derr := d.call("cuGraphDestroy", d.f.graphDestroy, g); err == nil && derr != nil {
		return 0, errors.Join(derr, d.GraphExecDestroy(x))
	}
	return x, err
}

// GraphLaunch queues x on s.
func (d *Driver) GraphLaunch(x GraphExec, s Stream) error {
	return d.call("cuGraphLaunch", d.f.graphLaunch, uintptr(x), uintptr(s))
}

// GraphExecDestroy frees x; launches already queued still run.
func (d *Driver) GraphExecDestroy(x GraphExec) error {
	return d.call("cuGraphExecDestroy", d.f.graphExecDestroy, uintptr(x))
}
