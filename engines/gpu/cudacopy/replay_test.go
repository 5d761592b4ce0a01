// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// replayDriver stands in for the driver's captures: each capture returns a new exec, destroys are recorded.
type replayDriver struct {
	epoch     uint64
	next      cuda.GraphExec
	captured  []copyRange
	destroyed []cuda.GraphExec
	fail      error
}

func (d *replayDriver) replays() *copyReplays {
	return newCopyReplays(func() uint64 { return d.epoch }, func(r copyRange) (cuda.GraphExec, error) {
		if d.fail != nil {
			return 0, d.fail
		}
		d.next++
		d.captured = append(d.captured, r)
		return d.next, nil
	}, func(x cuda.GraphExec) { d.destroyed = append(d.destroyed, x) })
}

func TestCopyReplaysCaptureRepeatedRangesOnce(t *testing.T) {
	d := &replayDriver{}
	c := d.replays()
	r := copyRange{dst: 1 << 30, src: 2 << 30, size: 64 << 20}
	if _, ok := c.lookup(r); ok {
		t.Fatal("a range copied for the first time was replayed: a copy made once must pay no capture")
	}
	x, ok := c.lookup(r)
	if !ok || len(d.captured) != 1 || d.captured[0] != r {
		t.Fatalf("second copy: replayed %v, captures %v; want one capture of %v", ok, d.captured, r)
	}
	for range 5 {
		if y, ok := c.lookup(r); !ok || y != x {
			t.Fatalf("a kept range replayed %v (exec %d), want exec %d", ok, y, x)
		}
	}
	if len(d.captured) != 1 {
		t.Fatalf("%d captures of one range", len(d.captured))
	}
	// Other sizes of the same addresses are other copies.
	if _, ok := c.lookup(copyRange{dst: r.dst, src: r.src, size: r.size / 2}); ok {
		t.Fatal("a range of another size replayed the kept one")
	}
	big := copyRange{dst: 8 << 30, src: 9 << 30, size: replayMax}
	for range 3 {
		if _, ok := c.lookup(big); ok {
			t.Fatalf("a range of %d bytes was replayed: past replayMax graphs copy slower", big.size)
		}
	}
	if len(d.captured) != 1 {
		t.Fatalf("captures %v, want only the first range's", d.captured)
	}
}

func TestCopyReplaysDropEverythingWhenAMappingIsReleased(t *testing.T) {
	d := &replayDriver{}
	c := d.replays()
	a, b := copyRange{dst: 1 << 30, src: 2 << 30, size: 32 << 20}, copyRange{dst: 3 << 30, src: 4 << 30, size: 32 << 20}
	pending := copyRange{dst: 5 << 30, src: 6 << 30, size: 32 << 20}
	for _, r := range []copyRange{a, a, b, b, pending} {
		c.lookup(r)
	}
	if len(c.kept) != 2 {
		t.Fatalf("%d kept, want 2", len(c.kept))
	}
	d.epoch++ // a region was released: its addresses may come back as another mapping
	if _, ok := c.lookup(a); ok {
		t.Fatal("a range kept before a release was replayed after it")
	}
	if !slices.Equal(sortedExecs(d.destroyed), []cuda.GraphExec{1, 2}) {
		t.Fatalf("destroyed %v after the release, want both kept graphs", d.destroyed)
	}
	// The range seen once before the release is new again.
	if _, ok := c.lookup(pending); ok {
		t.Fatal("a range seen before the release was captured on its first copy after it")
	}
	if _, ok := c.lookup(a); !ok || len(d.captured) != 3 {
		t.Fatalf("the range copied twice since the release: replayed %v, captures %d (want 3)", ok, len(d.captured))
	}
}

func TestCopyReplaysKeepTheRecentlyUsed(t *testing.T) {
	d := &replayDriver{}
	c := d.replays()
	ranges := make([]copyRange, replayKept+1)
	for i := range ranges {
		ranges[i] = copyRange{dst: uint64(i+1) << 32, src: 1 << 30, size: 16 << 20}
	}
	for _, r := range ranges[:replayKept] {
		c.lookup(r)
		c.lookup(r)
	}
	c.lookup(ranges[0]) // the first range is now more recent than the second
	c.lookup(ranges[replayKept])
	c.lookup(ranges[replayKept])
	if len(c.kept) != replayKept {
		t.Fatalf("%d kept, want at most %d", len(c.kept), replayKept)
	}
	if len(d.destroyed) != 1 || d.destroyed[0] != 2 {
		t.Fatalf("destroyed %v, want the second range's graph (exec 2), the least recently used", d.destroyed)
	}
	if _, ok := c.kept[ranges[0]]; !ok {
		t.Fatal("the range used again was evicted")
	}
}

func TestCopyReplaysStopAfterAFailedCapture(t *testing.T) {
	d := &replayDriver{}
	c := d.replays()
	var told []string // what the copier's agent is told
	c.stopped = func(why string) { told = append(told, why) }
	kept := copyRange{dst: 1 << 30, src: 2 << 30, size: 16 << 20}
	c.lookup(kept)
	c.lookup(kept)
	d.fail = errors.New("cuStreamBeginCapture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
	r := copyRange{dst: 3 << 30, src: 4 << 30, size: 16 << 20}
	c.lookup(r)
	if _, ok := c.lookup(r); ok {
		t.Fatal("a failed capture was replayed")
	}
	if c.off == "" || len(d.destroyed) != 1 {
		t.Fatalf("after a failed capture: off %q, destroyed %v; want replays off and the kept graph destroyed", c.off, d.destroyed)
	}
	d.fail = nil
	for _, x := range []copyRange{kept, r, r, kept} {
		if _, ok := c.lookup(x); ok {
			t.Fatal("a copy was replayed after replays stopped")
		}
	}
	if len(d.captured) != 1 {
		t.Fatalf("captures %v after replays stopped", d.captured)
	}
	if len(told) != 1 || !strings.Contains(told[0], "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED") {
		t.Fatalf("told %q; want the failed capture once", told)
	}
}

func sortedExecs(xs []cuda.GraphExec) []cuda.GraphExec {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}

// A caller cycling through twice as many ranges as are kept, each coming back only after all the others, would
// make every other copy a capture whose graph is dropped unused: once as many graphs as are kept were dropped
// before a second launch, replays stop.
func TestCopyReplaysStopWhenRangesChurn(t *testing.T) {
	d := &replayDriver{}
	c := d.replays()
	told := 0
	c.stopped = func(string) { told++ }
	ranges := make([]copyRange, 2*replayKept)
	for i := range ranges {
		ranges[i] = copyRange{dst: uint64(i+1) << 32, src: 1 << 30, size: 16 << 20}
	}
	copies := 0
	for c.off == "" && copies < 10*len(ranges) {
		c.lookup(ranges[copies%len(ranges)])
		copies++
	}
	if c.off == "" {
		t.Fatalf("after %d copies cycling through %d ranges, %d captures and replays still on", copies, len(ranges), len(d.captured))
	}
	if len(d.captured) > 2*replayKept+1 || len(c.kept) != 0 || len(d.destroyed) != len(d.captured) {
		t.Fatalf("churn: %d captures, %d kept, %d destroyed; want at most %d captures and every graph destroyed",
			len(d.captured), len(c.kept), len(d.destroyed), 2*replayKept+1)
	}
	n := len(d.captured)
	for _, r := range ranges {
		c.lookup(r)
		c.lookup(r)
	}
	if len(d.captured) != n {
		t.Fatal("captures went on after replays stopped")
	}
	if told != 1 {
		t.Fatalf("told %d times that replays stopped, want once", told)
	}
	t.Logf("stopped after %d copies and %d captures: %s", copies, n, c.off)
}
