// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"fmt"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

const (
	// replayMax bounds the ranges replayed from a graph: on the H200 a 1 GiB copy launched from a graph ran at
	// 0.70 of the same cuMemcpyAsync, while waited 64 MiB ones came back 2.6 µs sooner (medians of five calls
	// through the socket).
	replayMax = 256 << 20
	// replayKept is how many instantiated copies one copier keeps (the least recently used goes).
	replayKept = 32
	// replaySeen bounds the ranges remembered as copied once (all are forgotten when it fills).
	replaySeen = 1024
)

// copyRange is one copy-engine copy: destination, source, bytes.
type copyRange struct{ dst, src, size uint64 }

// replay is a kept, instantiated copy of one range.
type replay struct {
	exec     cuda.GraphExec
	used     uint64 // the copier's use count at its last launch
	launches int
}

// copyReplays keeps the copy-engine ranges a copier queues again and again (a layout's 64 MiB block, the same
// tensor each step) as instantiated graphs: launching one costs less host time than a cuMemcpyAsync, whose
// driver looks both addresses up on every call, and the copy starts that much sooner. A range is captured the
// second time it is copied (a copy made once pays no capture), and every kept graph is dropped as soon as any
// mapping of the backend is released (epoch moves): a graph holds its addresses, which a later mapping may
// reuse. Not safe for concurrent use (the copier's lock guards it).
type copyReplays struct {
	epoch   func() uint64 // the backend's count of released mappings
	capture func(copyRange) (cuda.GraphExec, error)
	destroy func(cuda.GraphExec)

	at       uint64 // the epoch the kept graphs and seen ranges belong to
	uses     uint64
	kept     map[copyRange]*replay
	seen     map[copyRange]struct{}
	off      string // why replays stopped (a capture or launch failed): every copy is a cuMemcpyAsync then
	count    int    // captures made
	launched uint64 // copies launched from kept graphs (the copier counts them)
	// stopped, when set, is told why replays stopped.
	stopped func(why string)
	// wasted counts graphs evicted before a second launch: ranges that come back only after more than
	// replayKept others. At replayKept replays stop, so a caller cycling through many ranges does not make
	// every copy a capture (host time under the copier's lock, which other callers' copies wait for).
	wasted int
}

func newCopyReplays(epoch func() uint64, capture func(copyRange) (cuda.GraphExec, error), destroy func(cuda.GraphExec)) *copyReplays {
	return &copyReplays{epoch: epoch, capture: capture, destroy: destroy, at: epoch(),
		kept: map[copyRange]*replay{}, seen: map[copyRange]struct{}{}}
}

// lookup returns the graph to launch for r, or false when r goes as a plain copy this time.
func (c *copyReplays) lookup(r copyRange) (cuda.GraphExec, bool) {
	if c.off != "" || r.size >= replayMax {
		return 0, false
	}
	if e := c.epoch(); e != c.at {
		c.dropAll()
		c.at = e
	}
	c.uses++
	if k := c.kept[r]; k != nil {
		k.used = c.uses
		k.launches++
		return k.exec, true
	}
	if _, ok := c.seen[r]; !ok {
		if len(c.seen) >= replaySeen {
			clear(c.seen)
		}
		c.seen[r] = struct{}{}
		return 0, false
	}
	x, err := c.capture(r)
	if err != nil {
		c.stop(err)
		return 0, false
	}
	c.count++
	delete(c.seen, r)
	if len(c.kept) >= replayKept {
		c.evictOldest()
	}
	if c.off != "" { // the eviction found the kept ranges churning
		c.destroy(x)
		return 0, false
	}
	c.kept[r] = &replay{exec: x, used: c.uses, launches: 1}
	return x, true
}

func (c *copyReplays) evictOldest() {
	var oldest copyRange
	var at uint64 // uses count from 1, so 0 is "none yet"
	for r, k := range c.kept {
		if at == 0 || k.used < at {
			oldest, at = r, k.used
		}
	}
	k := c.kept[oldest]
	c.destroy(k.exec)
	delete(c.kept, oldest)
	if k.launches < 2 {
		if c.wasted++; c.wasted >= replayKept {
			c.stop(fmt.Errorf("%d captured ranges were dropped before they were copied again", c.wasted))
		}
	}
}

// stop turns replays off for good (a capture or a launch failed; the copies go as cuMemcpyAsync, which says
// what is wrong if anything still is) and destroys what was kept.
func (c *copyReplays) stop(err error) {
	c.off = err.Error()
	c.dropAll()
	if c.stopped != nil {
		c.stopped(c.off)
	}
}

// dropAll destroys every kept graph and forgets the ranges seen.
func (c *copyReplays) dropAll() {
	for _, k := range c.kept {
		c.destroy(k.exec)
	}
	clear(c.kept)
	clear(c.seen)
}
