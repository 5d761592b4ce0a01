// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

// CallerEntries is how many callers the region table keeps usage for (tests only).
func (s *Server) CallerEntries() int {
	s.table.Lock()
	defer s.table.Unlock()
	return s.table.CallersLocked()
}
