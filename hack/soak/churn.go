// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// churn restarts one node's agent over and over and keeps the windows in which transfer failures are
// expected: from the stop until settle after the agent is ready again.
type churn struct {
	mu      sync.Mutex
	windows [][2]time.Time // zero end: still open
	cycles  int
	downs   []time.Duration // stop → ready again
}

func (c *churn) open(at time.Time) {
	c.mu.Lock()
	c.windows = append(c.windows, [2]time.Time{at})
	c.mu.Unlock()
}

func (c *churn) close(at time.Time) {
	c.mu.Lock()
	c.windows[len(c.windows)-1][1] = at
	c.mu.Unlock()
}

// during reports whether [start, end] meets a churn window.
func (c *churn) during(start, end time.Time) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.windows {
		if !end.Before(w[0]) && (w[1].IsZero() || !start.After(w[1])) {
			return true
		}
	}
	return false
}

// agentChurn stops the churned agent every o.churnEvery, alternating SIGTERM and SIGKILL, keeps it down for
// o.agentDown, starts it again with the command line it had, and waits for its readiness, until stop closes.
func (c *churn) agentChurn(ctx context.Context, stop <-chan struct{}, o *options, hc *http.Client) error {
	pidFile := o.agentPIDFile(o.churnNode)
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		}
	}
	for i := 0; ; i++ {
		if !wait(o.churnEvery) {
			return nil
		}
		sig := syscall.SIGTERM
		if i%2 == 1 {
			sig = syscall.SIGKILL
		}
		if err := c.restart(ctx, o, hc, pidFile, sig); err != nil {
			return fmt.Errorf("agent churn cycle %d (%v): %w", i+1, sig, err)
		}
	}
}

// restart stops the agent in pidFile with sig and starts it again; the churn window stays open until settle
// after it is ready.
func (c *churn) restart(ctx context.Context, o *options, hc *http.Client, pidFile string, sig syscall.Signal) error {
	pid, err := pidFrom(pidFile)
	if err != nil {
		return err
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("reading the agent's command line: %w", err)
	}
	args := splitNul(cmdline)
	if len(args) == 0 {
		return fmt.Errorf("process %d has an empty command line", pid)
	}
	t0 := time.Now()
	c.open(t0)
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signalling agent %d: %w", pid, err)
	}
	if err := waitGone(ctx, pid, 20*time.Second); err != nil {
		return err
	}
	sleep(ctx, o.agentDown)
	log, err := os.OpenFile(o.agentLog(o.churnNode), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the agent's log: %w", err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a ^C to this program must not stop the agent before hack/soak.sh does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	log.Close()
	if err != nil {
		return fmt.Errorf("starting the agent again: %w", err)
	}
	// Reaped when it exits; it outlives this program when the run ends, and hack/soak.sh stops it.
	go func() { _ = cmd.Wait() }()
	// hack/soak.sh stops whatever the PID file names, whatever happens to this program.
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("recording the new agent's PID: %w", err)
	}
	if err := waitReady(ctx, hc, o.agentHealth(o.churnNode)+"/readyz", 60*time.Second); err != nil {
		return err
	}
	ready := time.Now()
	c.mu.Lock()
	c.cycles++
	c.downs = append(c.downs, ready.Sub(t0))
	c.mu.Unlock()
	go func() {
		time.Sleep(o.settle)
		c.close(time.Now())
	}()
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	for _, f := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
		out = append(out, string(f))
	}
	return out
}

// waitGone waits until process pid no longer exists (a child of another process may linger as a zombie until
// reaped; /proc/PID/stat says Z then).
func waitGone(ctx context.Context, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || zombie(st) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %d still running %s after it was signalled", pid, limit)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zombie reads the state field of /proc/PID/stat (after the parenthesised command name).
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// waitReady polls url until it answers 200 or limit passes.
func waitReady(ctx context.Context, hc *http.Client, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (last: %v)", url, limit, errors.Join(err, statusErr(resp)))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func statusErr(resp *http.Response) error {
	if resp == nil {
		return nil
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}
