// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"context"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// ErrPeerGone says the process behind a connection exited before the agent finished reading who it was: its
// pid may name another process by then, whose cgroup the agent would have read.
var ErrPeerGone = errors.New("the process exited while it was being identified")

// IdentifyConn identifies the process behind conn: SO_PEERCRED's pid, that pid's cgroup (Identify), then a
// check that the process that connected is still alive. SO_PEERCRED gives a number, and a number is reused
// once its process is reaped: a pod's process that connects and exits, with another pod's process given its
// pid meanwhile, would be identified as that other pod. While the process lives its pid is its own, so a
// cgroup read before the check was its. Where the kernel has no pidfd for a socket's peer (SO_PEERPIDFD,
// Linux 6.5) the check is skipped: identification is as it was, with that race.
func (id Identifier) IdentifyConn(ctx context.Context, conn *net.UnixConn) (Caller, error) {
	cred, err := PeerCredOf(conn)
	if err != nil {
		return Caller{}, err
	}
	c, err := id.Identify(ctx, cred)
	if err != nil {
		return Caller{}, err
	}
	if err := PeerAlive(conn); err != nil {
		return Caller{}, fmt.Errorf("identifying pid %d: %w", cred.PID, err)
	}
	return c, nil
}

// PeerAlive says whether the process that connected conn still runs (ErrPeerGone if not). nil also where the
// agent cannot tell (a kernel without SO_PEERPIDFD, a filter that hides it): refusing every caller there would
// be worse than the race.
func PeerAlive(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("getting the raw socket: %w", err)
	}
	var pidfd int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		pidfd, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return fmt.Errorf("reading SO_PEERPIDFD: %w", err)
	}
	switch {
	case errors.Is(gerr, unix.ESRCH), errors.Is(gerr, unix.EINVAL):
		return ErrPeerGone // kernels before 6.16 give no pidfd for a reaped peer
	case gerr != nil:
		return nil // a kernel before 6.5 (ENOPROTOOPT), or a filter that hides the option: it cannot tell
	}
	defer unix.Close(pidfd)
	// A pidfd polls readable once its process has exited. Polling needs no permission, where a signal 0 would
	// meet SELinux's or AppArmor's signal rules and refuse every caller of a confined agent.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil // cannot tell
		case n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0:
			return ErrPeerGone
		}
		return nil
	}
}
