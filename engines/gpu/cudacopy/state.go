// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"maps"
	"slices"
)

// Feature is a part of a copier's fast path that can be missing, or turn off while the agent runs, with the copier
// still copying (more slowly): an admin who sees copies slow down looks here first.
type Feature string

// Features a copier reports when they are off.
const (
	// FeatureKernels: scattered items move by the copy kernels; off, by the driver's batch or per-item copies.
	FeatureKernels Feature = "kernels"
	// FeatureDoneWord: waiters read a copy's end from a word the GPU writes; off, they ask the driver.
	FeatureDoneWord Feature = "done_word"
	// FeatureCopyReplay: copy-engine ranges that come again are launched from kept graphs; off, each is a
	// cuMemcpyAsync.
	FeatureCopyReplay Feature = "copy_replay"
)

// State is what one GPU's copier runs with.
type State struct {
	Ordinal int
	Mode    Mode
	// Off holds why each feature that is not in use is not (absent: in use).
	Off map[Feature]string
	// Replayed counts copy-engine copies launched from kept graphs; Captured the graphs captured for them.
	Replayed, Captured uint64
}

// State reports what c runs with now.
func (c *Copier) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := State{Ordinal: c.ordinal, Mode: c.mode, Off: map[Feature]string{}}
	if c.mode != ModeKernel {
		st.Off[FeatureKernels] = c.reason
	}
	if c.done == nil || c.doneOff {
		st.Off[FeatureDoneWord] = c.doneReason
	}
	switch {
	case c.opts.MappingEpoch == nil:
		st.Off[FeatureCopyReplay] = "not asked for (a copier outside a backend)"
	case c.replays == nil:
		st.Off[FeatureCopyReplay] = "the CUDA driver has no graph calls"
	case c.replays.off != "":
		st.Off[FeatureCopyReplay] = c.replays.off
	}
	if c.replays != nil {
		st.Replayed, st.Captured = c.replays.launched, uint64(c.replays.count)
	}
	return st
}

// States reports what each GPU's copier set up so far runs with, in ordinal order (a GPU's copier is set up when
// its memory is first registered).
func (b *Backend) States() []State {
	copiers := b.reg.Copiers()
	out := make([]State, 0, len(copiers))
	for _, ord := range slices.Sorted(maps.Keys(copiers)) {
		out = append(out, copiers[ord].State())
	}
	return out
}

// reportOff tells Options.FeatureOff that f is off on c's GPU, and why.
func (c *Copier) reportOff(f Feature, why string) {
	if c.opts.FeatureOff != nil {
		c.opts.FeatureOff(c.ordinal, f, why)
	}
}

// reportOffAtStart tells Options.FeatureOff of each feature a new copier starts without.
func (c *Copier) reportOffAtStart() {
	off := c.State().Off
	for _, f := range []Feature{FeatureKernels, FeatureDoneWord, FeatureCopyReplay} {
		if why, ok := off[f]; ok && (f != FeatureCopyReplay || c.opts.MappingEpoch != nil) {
			c.reportOff(f, why)
		}
	}
}
