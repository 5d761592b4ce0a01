// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
		for _, s := range poolSockets(dir) {
			if !slices.Contains(found, s) {
				found = append(found, s)
			}
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return def
}

// poolSockets are the pool sockets under dir (<dir>/<pool>/agent.sock), as they resolve, each once.
func poolSockets(dir string) []string {
	var found []string
	socks, _ := filepath.Glob(filepath.Join(dir, "*", "agent.sock"))
	for _, s := range socks {
		real, err := filepath.EvalSymlinks(s)
		if err == nil && isSocket(real) && !slices.Contains(found, real) {
			found = append(found, real)
		}
	}
	return found
}

// notAnAgentSocket says, at once and as Unavailable, why no agent can answer at path, naming what to dial
// instead: nothing there (gRPC retried the dial until the caller's deadline, or said only "no such file"), a
// folder or a file ("connection refused"), or the agent's fast or descriptor socket, which speak no gRPC ("error
// reading server preface"). nil for a socket of another name, and where path cannot be looked at (the dial
// then says why, a permission it lacks included).
func notAnAgentSocket(path string) error {
	refuse := func(why string) error {
		return status.Errorf(codes.Unavailable, "no agent at %s: %s", path, why)
	}
	if rest, ok := strings.CutPrefix(path, "unix:"); ok {
		return refuse("give the socket's path, without the unix: scheme: dial " + strings.TrimPrefix(rest, "//"))
	}
	if len(path) > sunPathMax {
		return refuse(fmt.Sprintf("the path is %d bytes, more than a Unix socket address holds (%d): give the agent's socket folder a shorter path (its --socket-dir, or a bind mount of it; a link is resolved back to the long path)", len(path), sunPathMax))
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if beside := filepath.Join(dir, "agent.sock"); isSocket(beside) {
			return refuse("nothing of that name, but the agent's socket is beside it: dial " + beside)
		}
		if pools := poolSockets(dir); len(pools) > 0 {
			return refuse("nothing of that name, but pools' sockets are in that folder: dial " + strings.Join(pools[:min(len(pools), 4)], " or "))
		}
		return refuse("there is no socket there: is the agent running, and is this its socket directory " +
			"(<socket dir>/<pool>/agent.sock; " + SocketEnv + " names it in a pod with a claim)?")
	case err != nil:
		return nil
	case fi.IsDir():
		inside := poolSockets(path)
		if own := filepath.Join(path, "agent.sock"); isSocket(own) {
			inside = append([]string{own}, inside...)
		}
		if len(inside) == 0 {
			return refuse("it is a folder, not a socket: dial a pool's socket (<socket dir>/<pool>/agent.sock)")
		}
		return refuse("it is a folder, not a socket: dial " + strings.Join(inside[:min(len(inside), 4)], " or "))
	case fi.Mode()&os.ModeSocket == 0:
		return refuse("it is not a socket: dial the agent's (<socket dir>/<pool>/agent.sock)")
	}
	switch filepath.Base(path) {
	case FastSocketName:
		return refuse("it is the agent's fast socket, which the client opens itself: dial " + filepath.Join(dir, "agent.sock"))
	case FDSocketName:
		return refuse("it is the agent's descriptor socket, which the client opens itself: dial " + filepath.Join(dir, "agent.sock"))
	}
	return nil
}

// sunPathMax is the longest path a Unix socket address holds (sockaddr_un.sun_path, less its terminating zero).
const sunPathMax = 107

// notBesideAgentSocket explains a connect to one of the agent's other sockets that found nothing there while
// agent.sock answered: a pod that mounts agent.sock alone (a hostPath of the file, not of its folder) reaches the
// agent but not the sockets beside it. what names the socket; optOut, when not empty, how to go without it.
func notBesideAgentSocket(path, what, optOut string, err error) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	why := fmt.Sprintf("the agent answered on %s but its %s socket %s is not beside it: mount the agent's whole socket "+
		"folder (agent.sock, %s, %s), not agent.sock alone (an agent that is restarting makes it again in a moment)", filepath.Join(filepath.Dir(path), "agent.sock"), what, path,
		FastSocketName, FDSocketName)
	if optOut != "" {
		why += ", or " + optOut
	}
	return fmt.Errorf("%s: %w", why, err)
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
