// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"os"
	"path/filepath"
	"slices"
)

// SocketEnv is the environment variable that names the agent socket; a prepared fabricxfer.io ResourceClaim
// sets it in the pod's containers.
const SocketEnv = "FABRICXFER_SOCKET"

// DefaultSocket is where a claim (or the documented hostPath mount) puts the agent socket in a container.
const DefaultSocket = "/run/fabricxfer/agent.sock"

// SocketPath is path when it is set, else $FABRICXFER_SOCKET, else DefaultSocket when it exists (a pod's
// mount), else the one pool socket on this host (an agent run standalone, or a DaemonSet's on its node), else
// DefaultSocket. Several pools' sockets are not guessed between: dialing DefaultSocket then fails naming them.
// The Python client and xferctl find the socket by the same rule.
func SocketPath(path string) string {
	// Where agents put their pools' sockets on a host (<dir>/<pool>/agent.sock): the default socket directory of a
	// TransferPool and of "agent standalone", under both names /var/run usually has.
	return socketPath(path, os.Getenv(SocketEnv), DefaultSocket, []string{"/run/fabricxfer", "/var/run/fabricxfer"})
}

func socketPath(path, env, def string, hostDirs []string) string {
	switch {
	case path != "":
		return path
	case env != "":
		return env
	case isSocket(def):
		return def
	}
	var found []string
	for _, dir := range hostDirs {
		socks, _ := filepath.Glob(filepath.Join(dir, "*", "agent.sock"))
		for _, s := range socks {
			real, err := filepath.EvalSymlinks(s)
			if err == nil && isSocket(real) && !slices.Contains(found, real) {
				found = append(found, real)
			}
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return def
}

func isSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// DialDefault dials the socket SocketPath("") names: the one a prepared claim gave the container, or the one
// agent socket of this host.
func DialDefault(ctx context.Context, opts ...Option) (*Client, error) {
	return Dial(ctx, SocketPath(""), opts...)
}
