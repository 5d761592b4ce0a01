// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"os"
)

// SocketEnv is the environment variable that names the agent socket; a prepared fabricxfer.io ResourceClaim
// sets it in the pod's containers.
const SocketEnv = "FABRICXFER_SOCKET"

// DefaultSocket is where a claim (or the documented hostPath mount) puts the agent socket in a container.
const DefaultSocket = "/run/fabricxfer/agent.sock"

// SocketPath is path when it is set, else $FABRICXFER_SOCKET, else DefaultSocket.
func SocketPath(path string) string {
	if path != "" {
		return path
	}
	if env := os.Getenv(SocketEnv); env != "" {
		return env
	}
	return DefaultSocket
}

// DialDefault dials the socket SocketPath("") names: the one a prepared claim gave the container.
func DialDefault(ctx context.Context, opts ...Option) (*Client, error) {
	return Dial(ctx, SocketPath(""), opts...)
}
