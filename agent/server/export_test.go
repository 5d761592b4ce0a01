// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

// CallerEntries is how many callers the region table keeps usage for (tests only).
func (s *Server) CallerEntries() int {
	s.table.Lock()
	defer s.table.Unlock()
	return s.table.CallersLocked()
}

// OpenCalls is how many calls holder has open on agent.sock as the agent counts them (tests only).
func (s *Server) OpenCalls(holder string) int {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	return s.streams.callers.Of(holder) + s.streams.refused.Of(holder)
}
