// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

// MailboxRequests reports whether c's fast connection has a mailbox and how many requests went through it.
func MailboxRequests(c *Client) (attached bool, n uint64) {
	c.fastMu.Lock()
	defer c.fastMu.Unlock()
	if c.mbox == nil {
		return false, 0
	}
	return true, c.mbox.Sequence()
}

// HasIDArena reports whether c's fast connection has an id arena.
func HasIDArena(c *Client) bool {
	c.fastMu.Lock()
	defer c.fastMu.Unlock()
	return c.arena != nil
}
