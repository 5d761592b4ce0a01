// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package coretest

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Beside is what a thread sharing one CPU with a polling loop saw.
type Beside struct {
	// Kept counts the times the thread waited over a millisecond to run again; Longest is its longest wait.
	Kept    int
	Longest time.Duration
	// StillPolling says the loop still polled when the thread's time was over (what was measured was beside
	// it).
	StillPolling bool
}

// RunBeside runs poll on a thread pinned to one CPU the process may use and, once polling reports true, a second
// thread pinned to the same CPU that runs for d; it returns what that thread saw once poll returned too. poll must
// poll for longer than d and then end by itself. It skips t where two threads cannot run at once on one CPU.
func RunBeside(t testing.TB, d time.Duration, poll func(), polling func() bool) Beside {
	t.Helper()
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs GOMAXPROCS >= 2: the polling loop and the other thread run at once, on one CPU")
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Skipf("no CPU affinity here: %v", err)
	}
	cpu := -1
	for i := range 1024 {
		if allowed.IsSet(i) {
			cpu = i
			break
		}
	}
	pin := func() error {
		runtime.LockOSThread()
		var one unix.CPUSet
		one.Set(cpu)
		return unix.SchedSetaffinity(0, &one)
	}

	pinned, polled := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(polled)
		defer runtime.UnlockOSThread()
		if err := pin(); err != nil {
			pinned <- err
			return
		}
		pinned <- nil
		poll()
	}()
	if err := <-pinned; err != nil {
		t.Skipf("cannot pin a thread to CPU %d: %v", cpu, err)
	}
	for deadline := time.Now().Add(5 * time.Second); !polling(); {
		if time.Now().After(deadline) {
			t.Fatal("the loop never started polling")
		}
		runtime.Gosched()
	}
	seen := make(chan Beside, 1)
	go func() {
		defer runtime.UnlockOSThread()
		var b Beside
		if err := pin(); err != nil {
			b.Kept = -1
			seen <- b
			return
		}
		start := time.Now()
		for last := start; last.Sub(start) < d; {
			now := time.Now()
			if gap := now.Sub(last); gap > time.Millisecond {
				b.Kept++
				b.Longest = max(b.Longest, gap)
			}
			last = now
		}
		b.StillPolling = polling()
		seen <- b
	}()
	b := <-seen
	<-polled
	if b.Kept < 0 {
		t.Skipf("cannot pin a second thread to CPU %d", cpu)
	}
	if !b.StillPolling {
		t.Fatalf("the loop stopped polling before the other thread's %v were over: nothing was measured", d)
	}
	t.Logf("beside a polling loop on CPU %d, another thread was kept off it for over 1 ms %d times in %v (longest %v)", cpu, b.Kept, d, b.Longest)
	return b
}
