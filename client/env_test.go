// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestDialDefaultReadsFabricxferSocket: with no path, the client dials what $FABRICXFER_SOCKET names (as a
// prepared claim's CDI spec sets it); without it, the rule of TestSocketPathFindsTheOneAgentOfTheHost.
func TestDialDefaultReadsFabricxferSocket(t *testing.T) {
	t.Setenv(client.SocketEnv, "")
	if got := client.SocketPath("/x/agent.sock"); got != "/x/agent.sock" {
		t.Fatalf("SocketPath with a path = %q", got)
	}
	srv := startLocal(t)
	t.Setenv(client.SocketEnv, srv.SocketPath())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.DialDefault(ctx, client.WithName("env-test"))
	if err != nil {
		t.Fatalf("DialDefault with %s=%s: %v", client.SocketEnv, srv.SocketPath(), err)
	}
	defer c.Close()
	if v := c.Info().GetAgentVersion(); v != "test" {
		t.Fatalf("agent version through the default socket: %q", v)
	}
}
