// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"os"
	"time"
)

// waitReady calls fn once path exists (the last socket Serve creates), or never if ctx ends first.
func waitReady(ctx context.Context, path string, fn func()) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			fn()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
