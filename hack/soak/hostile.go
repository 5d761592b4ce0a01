// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	fxclient "github.com/fabricxfer/fabricxfer/client"
)

// hostile runs beside the workers against the agents that are not restarted: it keeps idle connections open on
// every socket, sends garbage, oversized and half frames, and registers shared memory that is not sealed. The
// agents must stay up, refuse each with a clear error, and the workers must lose nothing.
type hostile struct {
	mu         sync.Mutex
	rounds     int
	refused    int
	unexpected []string
}

// idlePerSocket is how many idle connections each socket holds at any time; they are replaced a few at a time,
// so the agents' descriptor counts stay level and the soak's growth check still judges them.
const idlePerSocket = 16

func (h *hostile) run(ctx context.Context, stop <-chan struct{}, o *options) {
	var socks []string
	for _, n := range o.nodes {
		if n == o.churnNode {
			continue
		}
		dir := filepath.Dir(o.socket(n))
		socks = append(socks, filepath.Join(dir, "agent.sock"), filepath.Join(dir, "agent.fd.sock"), filepath.Join(dir, "agent.fast.sock"))
	}
	idle := map[string][]net.Conn{}
	defer func() {
		for _, cs := range idle {
			for _, c := range cs {
				c.Close()
			}
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, s := range socks {
			cs := idle[s]
			for len(cs) > idlePerSocket-2 {
				cs[0].Close()
				cs = cs[1:]
			}
			for len(cs) < idlePerSocket {
				c, err := net.DialTimeout("unix", s, time.Second)
				if err != nil {
					break // the agent may refuse at a limit; that is its answer
				}
				cs = append(cs, c)
			}
			idle[s] = cs
			h.garbage(s)
		}
		if len(socks) > 0 {
			h.unsealed(ctx, socks[0])
		}
		h.mu.Lock()
		h.rounds++
		h.mu.Unlock()
	}
}

// garbage sends what no client sends: a frame announcing 1 GiB, half a frame, and a line of noise.
func (h *hostile) garbage(sock string) {
	for _, payload := range [][]byte{
		binary.BigEndian.AppendUint32(nil, 1<<30),
		append(binary.BigEndian.AppendUint32(nil, 100), "half"...),
		[]byte("GARBAGE \x00\xff not a request\n"),
	} {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			continue
		}
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(payload)
		c.Close()
	}
}

// unsealed registers a memfd that is not sealed against shrinking; the agent must refuse it.
func (h *hostile) unsealed(ctx context.Context, sock string) {
	fd, err := unix.MemfdCreate("soak-hostile", unix.MFD_CLOEXEC) // not sealable, so the client cannot seal it
	if err != nil {
		h.note("memfd_create: %v", err)
		return
	}
	f := os.NewFile(uintptr(fd), "soak-hostile")
	defer f.Close()
	if err := f.Truncate(1 << 16); err != nil {
		h.note("sizing a memfd: %v", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := fxclient.Dial(cctx, sock, fxclient.WithoutFastPath())
	if err != nil {
		return // a socket at its limits refuses; counted by the agent, not a failure here
	}
	defer c.Close()
	if _, err := c.RegisterHost(cctx, f, 0, 1<<16); err == nil {
		h.note("the agent registered an unsealed memfd")
	} else {
		h.mu.Lock()
		h.refused++
		h.mu.Unlock()
	}
}

func (h *hostile) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.unexpected) < 8 {
		h.unexpected = append(h.unexpected, fmt.Sprintf(format, args...))
	}
}

func (h *hostile) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprintf("hostile client: %d rounds, %d unsealed registrations refused", h.rounds, h.refused)
}
