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
