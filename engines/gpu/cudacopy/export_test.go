// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

// CopierOf is the backend's copier of a GPU, for tests that drive it directly.
func (b *Backend) CopierOf(ordinal int) (*Copier, error) { return b.copier(ordinal) }

// IDsInPlace reports whether ids lie in the backend's pinned id buffers, where the check kernel reads them.
func (c *Copier) IDsInPlace(ids []uint32) bool {
	_, ok := c.ids.at(ids)
	return ok
}

// DoneSeq is the sequence number p's end writes to its copier's done word (0: none).
func (p *Pending) DoneSeq() uint32 { return p.doneSeq }

// DoneWordReached reports whether c's done word shows seq.
func (c *Copier) DoneWordReached(seq uint32) bool { return c.done.Reached(seq) }

// HasEvent reports whether p's submission recorded a completion event of its own.
func (p *Pending) HasEvent() bool { return p.event != 0 }

// SignalledByKernel reports whether p's kernel writes its done word itself (no stream write behind it).
func (p *Pending) SignalledByKernel() bool { return p.byKernel }

// ReplayCaptures is how many copy-engine ranges c captured as graphs, and why replays are off ("" while on).
func (c *Copier) ReplayCaptures() (int, string) {
	st := c.State()
	return int(st.Captured), st.Off[FeatureCopyReplay]
}
