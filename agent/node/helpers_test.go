// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fabricxfer/fabricxfer/client"
)

// testdata holds the fixture nodes' host roots.
const testdata = "../../topology/testdata"

// dialNode connects a client to the pool socket of the agent cfg runs, closed when the test ends.
func dialNode(ctx context.Context, t *testing.T, cfg Config) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, filepath.Join(cfg.SocketDir, cfg.PoolName, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
