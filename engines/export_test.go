// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

// Queued is how many Takes wait for a slot (tests order their waiters by it).
func (s *Slots) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.waiting {
		n += len(q)
	}
	return n
}
