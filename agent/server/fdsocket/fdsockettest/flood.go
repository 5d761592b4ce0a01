// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdsockettest

import (
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FloodPeak has conns connections push descriptors at the fd socket at path as fast as they can (each
// connection sends up to perConn messages of four descriptors, then reconnects; deadline bounds one connection)
// for 1.5 s, and returns the most descriptors this process held above its baseline meanwhile: the flood's and
// the agent's, which share the process.
func FloodPeak(t *testing.T, path string, conns, perConn int, deadline time.Duration) int {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	base := OpenFDCount(t)
	rights := syscall.UnixRights(int(r.Fd()), int(w.Fd()), int(r.Fd()), int(w.Fd()))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(deadline))
				for j := 0; j < perConn; j++ {
					if _, _, err := c.WriteMsgUnix([]byte("P"), rights, nil); err != nil {
						break
					}
				}
				c.Close()
			}
		}()
	}
	peak := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		peak = max(peak, OpenFDCount(t)-base)
	}
	close(stop)
	wg.Wait()
	return peak
}

// OpenFDCount is how many descriptors this process has open (the test skips where /proc/self/fd is missing).
func OpenFDCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}
