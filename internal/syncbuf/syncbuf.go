// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects writes from any goroutine; String returns what was written so far.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
