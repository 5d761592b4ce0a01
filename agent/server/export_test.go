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

// OnRegionAdded has f run each time a region was recorded, before the call that added it goes on; nil removes
// it (tests only).
func (s *Server) OnRegionAdded(f func()) { s.table.SetAddedHook(f) }

// Sessions is how many sessions the agent holds; a session is gone once its teardown finished (tests only).
func (s *Server) Sessions() int {
	s.table.Lock()
	defer s.table.Unlock()
	return len(s.sessions)
}

// QueuedNotificationBytes is the bytes of notifications the agent holds for listeners (tests only).
func (s *Server) QueuedNotificationBytes() int {
	s.table.Lock()
	defer s.table.Unlock()
	return s.xfer.QueuedNotificationBytesLocked()
}
