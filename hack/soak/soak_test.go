// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

func flat(t0 time.Time, n int, f func(i int) sample) *series {
	s := &series{Name: "p"}
	for i := range n {
		x := f(i)
		x.At = t0.Add(time.Duration(i) * time.Second)
		s.Samples = append(s.Samples, x)
	}
	return s
}

func TestJudge(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	warm, end := t0.Add(20*time.Second), t0.Add(59*time.Second)
	base := sample{RSSKiB: 100 << 10, Goroutines: 100, FDs: 30, Threads: 10}
	cases := []struct {
		name string
		last sample
		want []string // substrings of the problems, in order
	}{
		{"flat", base, nil},
		{"within both allowances", sample{RSSKiB: 124 << 10, Goroutines: 119, FDs: 40}, nil},
		// 25 % of 100 MiB is 25 MiB, more than 20 MiB: 126 MiB is over.
		{"RSS past 25 %", sample{RSSKiB: 126 << 10, Goroutines: 100, FDs: 30}, []string{"RSS grew"}},
		{"goroutines past 20", sample{RSSKiB: 100 << 10, Goroutines: 121, FDs: 30}, []string{"goroutines grew"}},
		{"fds past 10", sample{RSSKiB: 100 << 10, Goroutines: 100, FDs: 41}, []string{"open fds grew"}},
		{"no goroutine count", sample{RSSKiB: 100 << 10, Goroutines: -1, FDs: 30}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := flat(t0, 60, func(i int) sample {
				if i >= 45 {
					return c.last
				}
				// One outlier in the baseline span must not move the median.
				if i == 15 {
					return sample{RSSKiB: 500 << 10, Goroutines: 900, FDs: 300}
				}
				return base
			})
			b, l, problems := judge(s, warm, end, 10*time.Second, defaultTolerance)
			if b.RSSKiB != base.RSSKiB || b.Goroutines != base.Goroutines || b.FDs != base.FDs {
				t.Fatalf("baseline %+v, want the median %+v", b, base)
			}
			if l.RSSKiB != c.last.RSSKiB {
				t.Fatalf("last RSS %d, want %d", l.RSSKiB, c.last.RSSKiB)
			}
			if len(problems) != len(c.want) {
				t.Fatalf("problems %q, want %d matching %q", problems, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(problems[i], w) {
					t.Fatalf("problem %q does not say %q", problems[i], w)
				}
			}
		})
	}
}

func TestJudgeSmallProcessUsesAbsoluteAllowance(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	s := flat(t0, 60, func(i int) sample {
		if i >= 45 {
			return sample{RSSKiB: 29 << 10, Goroutines: 30, FDs: 10} // +19 MiB, +20 goroutines: within
		}
		return sample{RSSKiB: 10 << 10, Goroutines: 10, FDs: 10}
	})
	if _, _, p := judge(s, t0.Add(20*time.Second), t0.Add(59*time.Second), 10*time.Second, defaultTolerance); len(p) != 0 {
		t.Fatalf("problems %q, want none", p)
	}
	s.Samples[len(s.Samples)-1].RSSKiB = 31 << 10
	for i := 45; i < 60; i++ {
		s.Samples[i].RSSKiB = 31 << 10
	}
	if _, _, p := judge(s, t0.Add(20*time.Second), t0.Add(59*time.Second), 10*time.Second, defaultTolerance); len(p) != 1 {
		t.Fatalf("problems %q, want RSS over 20 MiB", p)
	}
}

func TestJudgeNoSamples(t *testing.T) {
	s := &series{Name: "gone"}
	if _, _, p := judge(s, time.Now(), time.Now(), time.Second, defaultTolerance); len(p) != 1 {
		t.Fatalf("problems %q, want one for no samples", p)
	}
}

func TestParseGoroutines(t *testing.T) {
	text := "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 137\ngo_threads 12\n"
	if g := parseGoroutines([]byte(text)); g != 137 {
		t.Fatalf("go_goroutines %d, want 137", g)
	}
	if g := parseGoroutines([]byte("go_threads 12\n")); g != -1 {
		t.Fatalf("absent metric read as %d, want -1", g)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("transferring: %w", context.DeadlineExceeded), "deadline"},
		{status.Error(codes.DeadlineExceeded, "cut short"), "grpc-DeadlineExceeded"},
		{&client.TransferError{Status: &agentv1.TransferStatus{State: agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED}}, "deadline"},
		{fmt.Errorf("transferring: %w (%v)", client.ErrSessionLost, errors.New("eof")), "session-lost"},
		{&client.TransferError{Status: &agentv1.TransferStatus{State: agentv1.TransferState_TRANSFER_STATE_FAILED}}, "transfer-failed"},
		{fmt.Errorf("transferring: %w", status.Error(codes.Unavailable, "peer down")), "grpc-Unavailable"},
	}
	for _, c := range cases {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestChurnWindows(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	c := &churn{}
	if c.during(at(0), at(1)) {
		t.Fatal("no window yet, but during")
	}
	c.open(at(10))
	if !c.during(at(100), at(101)) {
		t.Fatal("an open window must cover everything after its start")
	}
	c.close(at(20))
	for _, x := range []struct {
		from, to int
		want     bool
	}{{0, 9, false}, {5, 10, true}, {12, 13, true}, {19, 25, true}, {21, 22, false}} {
		if got := c.during(at(x.from), at(x.to)); got != x.want {
			t.Errorf("during(%d, %d) = %v, want %v", x.from, x.to, got, x.want)
		}
	}
}

func TestProcSampleSelf(t *testing.T) {
	s, err := selfSample()
	if err != nil {
		t.Fatal(err)
	}
	if s.RSSKiB <= 0 || s.Threads <= 0 || s.FDs < 3 || s.Goroutines <= 0 {
		t.Fatalf("implausible sample of this process: %+v", s)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s2, err := selfSample()
	if err != nil {
		t.Fatal(err)
	}
	if s2.FDs != s.FDs+1 {
		t.Fatalf("fds %d after opening one more, want %d", s2.FDs, s.FDs+1)
	}
}

func TestZombie(t *testing.T) {
	if !zombie([]byte("123 (agent) Z 1 123")) || zombie([]byte("123 (a) b) S 1")) {
		t.Fatal("state field misread")
	}
}

func TestParseDefaults(t *testing.T) {
	o, err := parse([]string{"-duration", "60s", "-state", "/x", "-kubeconfig", "/k"})
	if err != nil {
		t.Fatal(err)
	}
	if o.warmup != 15*time.Second || o.operatorPIDFile != "/x/operator.pid" {
		t.Fatalf("warm-up %s, operator PID file %s", o.warmup, o.operatorPIDFile)
	}
	if _, err := parse([]string{"-duration", "20s", "-state", "/x", "-kubeconfig", "/k"}); err == nil {
		t.Fatal("a run too short for warm-up and two spans was accepted")
	}
	if _, err := parse([]string{"-state", "/x", "-kubeconfig", "/k", "-churn-node", "nope"}); err == nil {
		t.Fatal("an unknown churn node was accepted")
	}
}

func TestOverDeadlineByElapsedTime(t *testing.T) {
	st := newStats(10 * time.Second)
	t0 := time.Unix(1_000_000, 0)
	cut := status.Error(codes.DeadlineExceeded, "transfer 1 submitted but still pending when the call ended: context canceled")
	st.record("w", outcome{start: t0, end: t0.Add(time.Second), err: cut}, nil)
	if st.overDeadline != 0 {
		t.Fatal("a call cut short after 1 s counted as over its deadline")
	}
	st.record("w", outcome{start: t0, end: t0.Add(10 * time.Second), err: errors.New("slow")}, nil)
	if st.overDeadline != 1 || st.failed != 2 {
		t.Fatalf("over deadline %d, failed %d; want 1 and 2", st.overDeadline, st.failed)
	}
	if len(st.outsideChurn) != 2 {
		t.Fatalf("failures outside churn %q, want both", st.outsideChurn)
	}
}
