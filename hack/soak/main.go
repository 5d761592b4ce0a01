// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/gcfloor"
)

func main() {
	klog.SetLogger(logr.Discard())
	ctrl.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", err)
		os.Exit(1)
	}
}

type options struct {
	duration, warmup, span, sampleEvery        time.Duration
	transferDeadline, agentTimeout             time.Duration
	recoverDeadline                            time.Duration
	churnEvery, agentDown, settle, poolEvery   time.Duration
	pause                                      time.Duration
	state, kubeconfig, poolNamespace, poolName string
	nodes                                      []string
	churnNode                                  string
	agentPortBase                              int
	operatorPIDFile, operatorMetrics           string
	regionSize, minSize                        uint64
	tol                                        tolerance
	hostile                                    bool
}

func (o *options) socket(node string) string {
	return filepath.Join(o.state, "sockets", node, o.poolName, "agent.sock")
}
func (o *options) agentPIDFile(node string) string {
	return filepath.Join(o.state, "agent-"+node+".pid")
}
func (o *options) agentLog(node string) string { return filepath.Join(o.state, "agent-"+node+".log") }

// agentHealth is the agent's health address in hack/demo.sh's layout: three ports per node from the base.
func (o *options) agentHealth(node string) string {
	return fmt.Sprintf("http://127.0.0.1:%d", o.agentPortBase+3*slices.Index(o.nodes, node)+2)
}

func parse(args []string) (*options, error) {
	o := &options{tol: defaultTolerance}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long transfers and churn run")
	fs.DurationVar(&o.warmup, "warmup", 0, "baseline taken at this point (default: a quarter of the duration, 15 s to 2 min)")
	fs.DurationVar(&o.span, "span", 10*time.Second, "baseline and final figures are medians over this span")
	fs.DurationVar(&o.sampleEvery, "sample-every", time.Second, "sampling period")
	fs.DurationVar(&o.transferDeadline, "transfer-deadline", 15*time.Second, "each transfer's deadline (call context)")
	fs.DurationVar(&o.agentTimeout, "agent-timeout", 10*time.Second, "each transfer's timeout on the agent")
	fs.DurationVar(&o.recoverDeadline, "recover-deadline", 60*time.Second, "deadline of a client's Recover after its agent restarted")
	fs.DurationVar(&o.churnEvery, "churn-every", 15*time.Second, "pause between agent restarts")
	fs.DurationVar(&o.agentDown, "agent-down", 2*time.Second, "how long the churned agent stays stopped")
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "after the churned agent is ready, failures still count as during churn this long")
	fs.DurationVar(&o.poolEvery, "pool-every", 5*time.Second, "pause between pool create/delete cycles")
	fs.DurationVar(&o.pause, "pause", 20*time.Millisecond, "pause between one worker's transfers (the machine is shared)")
	fs.StringVar(&o.state, "state", "", "hack/demo.sh's state directory (PID files, logs, sockets)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the control plane")
	fs.StringVar(&o.poolNamespace, "pool-namespace", "default", "namespace of the pool the agents serve")
	fs.StringVar(&o.poolName, "pool-name", "kv-cache", "pool the agents serve")
	nodes := fs.String("nodes", "gpu-node-a,gpu-node-b,rdma-node-c", "nodes, in hack/demo.sh's order (their ports follow it)")
	fs.StringVar(&o.churnNode, "churn-node", "rdma-node-c", "node whose agent is restarted over and over")
	fs.IntVar(&o.agentPortBase, "agent-port-base", 17470, "hack/demo.sh's AGENT_PORT_BASE")
	fs.StringVar(&o.operatorPIDFile, "operator-pidfile", "", "operator PID file (default STATE/operator.pid)")
	fs.StringVar(&o.operatorMetrics, "operator-metrics", "http://127.0.0.1:18080/metrics", "operator metrics URL")
	fs.Uint64Var(&o.regionSize, "region-size", 4<<20, "bytes of each region a worker owns (largest transfer)")
	fs.Uint64Var(&o.minSize, "min-size", 1<<10, "smallest transfer")
	fs.BoolVar(&o.hostile, "hostile", true, "run a hostile client beside the workers against the agents that are not restarted")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.nodes = strings.Split(*nodes, ",")
	if o.state == "" || o.kubeconfig == "" {
		return nil, errors.New("-state and -kubeconfig are required")
	}
	if !slices.Contains(o.nodes, o.churnNode) {
		return nil, fmt.Errorf("-churn-node %q is not in -nodes", o.churnNode)
	}
	if o.minSize == 0 || o.minSize > o.regionSize {
		return nil, errors.New("-min-size must be positive and at most -region-size")
	}
	if o.warmup == 0 {
		o.warmup = min(max(o.duration/4, 15*time.Second), 2*time.Minute)
	}
	if o.warmup+2*o.span > o.duration {
		return nil, fmt.Errorf("-duration %s leaves no room after a %s warm-up for two %s spans", o.duration, o.warmup, o.span)
	}
	if o.operatorPIDFile == "" {
		o.operatorPIDFile = filepath.Join(o.state, "operator.pid")
	}
	return o, nil
}

// tracked is a process sampled over the run. Long-lived ones are judged; the churned agent only reported.
type tracked struct {
	series
	pid     int
	pidFile string // re-read each sample (the churned agent changes PID)
	metrics string // go_goroutines source, empty for none
	judged  bool
	self    bool
	gone    error
}

func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	kube, err := kubeClient(o.kubeconfig)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 3 * time.Second}
	clients, workers, cleanup, err := setupWorkers(ctx, o)
	if err != nil {
		return err
	}
	defer cleanup()

	var procs []*tracked
	opPID, err := pidFrom(o.operatorPIDFile)
	if err != nil {
		return fmt.Errorf("operator: %w", err)
	}
	procs = append(procs, &tracked{series: series{Name: "operator"}, pid: opPID, metrics: o.operatorMetrics, judged: true})
	for _, n := range o.nodes {
		t := &tracked{series: series{Name: "agent " + n}, metrics: o.agentHealth(n) + "/metrics", judged: n != o.churnNode}
		if n == o.churnNode {
			t.Name += " (restarted)"
			t.pidFile = o.agentPIDFile(n)
		} else if t.pid, err = pidFrom(o.agentPIDFile(n)); err != nil {
			return fmt.Errorf("agent %s: %w", n, err)
		}
		procs = append(procs, t)
	}
	procs = append(procs, &tracked{series: series{Name: "soak client"}, judged: true, self: true})

	st := newStats(min(o.transferDeadline, o.agentTimeout))
	ch := &churn{}
	pc := &poolChurn{kube: kube}
	stop := make(chan struct{})
	start := time.Now()
	fmt.Printf("soak: %d workers over %v for %s (warm-up %s); restarting %s's agent every %s; a pool created and deleted every %s\n",
		len(workers), o.nodes, o.duration, o.warmup, o.churnNode, o.churnEvery, o.poolEvery)

	// Sampling and the hang watchdog run until everything else has stopped.
	samplerDone := make(chan struct{})
	samplerStop := make(chan struct{})
	var hung []string
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(o.sampleEvery)
		defer tick.Stop()
		nextReport := start.Add(30 * time.Second)
		for {
			sampleAll(ctx, hc, procs)
			if time.Now().After(nextReport) {
				nextReport = nextReport.Add(30 * time.Second)
				fmt.Printf("soak: %3d s: %s\n", int(time.Since(start).Seconds()), progress(st, ch, pc, procs))
			}
			for _, w := range workers {
				if s := w.inflight.Load(); s != 0 && time.Since(time.Unix(0, s)) > o.transferDeadline+5*time.Second && !w.hung.Swap(true) {
					hung = append(hung, fmt.Sprintf("%s: a transfer in flight for %s, past its %s deadline", w.name,
						time.Since(time.Unix(0, s)).Round(time.Second), o.transferDeadline))
				}
			}
			select {
			case <-tick.C:
			case <-samplerStop:
				return
			}
		}
	}()

	var wg sync.WaitGroup
	workersDone := make(chan struct{})
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, stop, o, st, ch)
		}()
	}
	go func() { wg.Wait(); close(workersDone) }()
	hc2 := &hostile{}
	hostileDone := make(chan struct{})
	go func() {
		defer close(hostileDone)
		if o.hostile {
			hc2.run(ctx, stop, o)
		}
	}()
	churnErr := make(chan error, 2)
	go func() { churnErr <- ch.agentChurn(ctx, stop, o, hc) }()
	go func() { churnErr <- pc.run(ctx, stop, o.poolEvery) }()

	var problems []string
	timer := time.NewTimer(o.duration)
	churnsLeft := 2
	select {
	case <-timer.C:
	case <-ctx.Done():
		problems = append(problems, "interrupted")
	case err := <-churnErr:
		churnsLeft--
		problems = append(problems, fmt.Sprintf("churn stopped early: %v", err))
	}
	timer.Stop()
	end := time.Now()
	close(stop)
	fmt.Printf("soak: %d s: stopping; churn finishes the cycle it is in, transfers drain\n", int(end.Sub(start).Seconds()))
	// Churn finishes the cycle it is in (each step has its own deadline), then transfers drain.
	for ; churnsLeft > 0; churnsLeft-- {
		if err := <-churnErr; err != nil {
			problems = append(problems, err.Error())
		}
	}
	drain := time.NewTimer(o.transferDeadline + 10*time.Second)
	select {
	case <-workersDone:
	case <-drain.C:
		problems = append(problems, fmt.Sprintf("transfers still running %s after the run ended", o.transferDeadline+10*time.Second))
	}
	drain.Stop()
	<-hostileDone
	close(samplerStop)
	<-samplerDone
	fmt.Printf("soak: stopped %d s after the end; checking the pool and leftovers\n", int(time.Since(end).Seconds()))

	// The main pool is whole again, and nothing of the churned pools is left.
	if err := poll(ctx, 30*time.Second, "the pool to count every node ready", func() (bool, string, error) {
		var p v1alpha1.TransferPool
		if err := kube.Get(ctx, client.ObjectKey{Namespace: o.poolNamespace, Name: o.poolName}, &p); err != nil {
			return false, "", err
		}
		want := fmt.Sprintf("%d/%d", len(o.nodes), len(o.nodes))
		return p.Status.Nodes == want, "nodes " + p.Status.Nodes + ", want " + want, nil
	}); err != nil {
		problems = append(problems, err.Error())
	}
	left, err := orphans(ctx, kube, [][2]string{{o.poolNamespace, o.poolName}})
	if err != nil {
		problems = append(problems, err.Error())
	} else if len(left) > 0 {
		problems = append(problems, "left behind by deleted pools: "+strings.Join(left, ", "))
	}

	st.mu.Lock()
	defer st.mu.Unlock()
	lost := st.submitted - st.completed - st.failed
	if lost != 0 {
		problems = append(problems, fmt.Sprintf("%d transfers lost (submitted but neither completed nor failed)", lost))
	}
	if st.corrupt > 0 {
		problems = append(problems, fmt.Sprintf("%d transfers completed with wrong bytes", st.corrupt))
	}
	if st.overDeadline > 0 {
		problems = append(problems, fmt.Sprintf("%d transfers ran into their deadline: %s", st.overDeadline, strings.Join(st.overDeadlineEx, " | ")))
	}
	problems = append(problems, hung...)
	if o.hostile {
		fmt.Println("soak: " + hc2.summary())
		for _, u := range hc2.unexpected {
			problems = append(problems, "hostile client: "+u)
		}
		if hc2.rounds == 0 {
			problems = append(problems, "the hostile client ran no round")
		}
	}
	if n := st.failed - st.failedInChurn; n > 0 {
		problems = append(problems, fmt.Sprintf("%d transfers failed outside agent churn, e.g. %s", n, strings.Join(st.outsideChurn, " | ")))
	}
	for _, e := range st.recoverErrors {
		problems = append(problems, "client recovery failed: "+e)
	}
	for _, w := range workers {
		if st.perWorkerCount[w.name] == 0 {
			problems = append(problems, fmt.Sprintf("worker %s completed no transfer", w.name))
		}
	}
	if ch.cycles == 0 {
		problems = append(problems, "no agent restart completed: raise -duration or lower -churn-every")
	}
	if pc.cycles.Load() == 0 {
		problems = append(problems, "no pool create/delete cycle completed")
	}

	// Figures.
	warmupEnd := start.Add(o.warmup)
	var agentBase, agentLast sample
	var agentGrowth int64 = -1 << 62
	var opBase, opLast sample
	for _, p := range procs {
		if p.gone != nil {
			problems = append(problems, p.gone.Error())
		}
		tol := o.tol
		if strings.HasPrefix(p.Name, "agent ") {
			// An agent holds a heap floor for its collector (internal/gcfloor): up to that much garbage between
			// collections is its design, not a leak.
			tol.RSSKiB += gcfloor.Default >> 10
		}
		base, last, pr := judge(&p.series, warmupEnd, end, o.span, tol)
		fmt.Printf("soak: %-28s RSS %4d → %4d MiB, goroutines %s → %s, threads %d → %d, fds %d → %d (%d samples)\n",
			p.Name, base.RSSKiB>>10, last.RSSKiB>>10, count(base.Goroutines), count(last.Goroutines),
			base.Threads, last.Threads, base.FDs, last.FDs, len(p.Samples))
		if !p.judged {
			continue
		}
		problems = append(problems, pr...)
		switch {
		case p.Name == "operator":
			opBase, opLast = base, last
		case strings.HasPrefix(p.Name, "agent ") && last.RSSKiB-base.RSSKiB > agentGrowth:
			agentGrowth, agentBase, agentLast = last.RSSKiB-base.RSSKiB, base, last
		}
	}
	var downs []string
	for _, d := range ch.downs {
		downs = append(downs, d.Round(100*time.Millisecond).String())
	}
	recovers, retries := int64(0), int64(0)
	for _, c := range clients {
		recovers += c.recovered.Load()
		retries += c.retries.Load()
		if e, ok := c.lastErr.Load().(string); ok {
			fmt.Printf("soak: %s's client retried Recover %d times, last because: %s\n", c.name, c.retries.Load(), e)
		}
	}
	fmt.Printf("soak: %d agent restarts of %s (stopped → ready: %s), %d client recoveries (%d retried); %d pools created and deleted (slowest: objects in %s, gone in %s)\n",
		ch.cycles, o.churnNode, strings.Join(downs, " "), recovers, retries, pc.cycles.Load(), pc.maxUp.Round(time.Millisecond), pc.maxDown.Round(time.Millisecond))
	fmt.Printf("soak: %d transfers completed and verified (%.1f MiB), slowest %s; failures: %s\n",
		st.completed, float64(st.bytes)/(1<<20), st.maxLatency.Round(time.Millisecond), orNone(st.classSummaryLocked()))
	for class, ex := range st.examples {
		fmt.Printf("soak:   e.g. %s: %s\n", class, ex)
	}
	fmt.Printf("soak: %d s, %d transfers (%d failed during churn, %d lost), agent RSS %d→%d MiB, goroutines %s→%s, fds %d→%d; operator RSS %d→%d MiB, goroutines %s→%s, fds %d→%d\n",
		int(end.Sub(start).Seconds()), st.submitted, st.failedInChurn, lost,
		agentBase.RSSKiB>>10, agentLast.RSSKiB>>10, count(agentBase.Goroutines), count(agentLast.Goroutines), agentBase.FDs, agentLast.FDs,
		opBase.RSSKiB>>10, opLast.RSSKiB>>10, count(opBase.Goroutines), count(opLast.Goroutines), opBase.FDs, opLast.FDs)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n  "))
	}
	return nil
}

func count(n int64) string {
	if n < 0 {
		return "n/a"
	}
	return fmt.Sprint(n)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// sampleAll takes one sample of every tracked process. A long-lived process that is gone is recorded once.
func sampleAll(ctx context.Context, hc *http.Client, procs []*tracked) {
	for _, p := range procs {
		var s sample
		var err error
		switch {
		case p.self:
			s, err = selfSample()
		case p.pidFile != "":
			var pid int
			if pid, err = pidFrom(p.pidFile); err == nil {
				s, err = procSample(pid)
			}
		default:
			s, err = procSample(p.pid)
		}
		if err != nil {
			if p.judged && p.gone == nil {
				p.gone = fmt.Errorf("%s (PID %d) is gone: %w", p.Name, p.pid, err)
			}
			continue
		}
		if p.metrics != "" {
			if g, err := goroutines(ctx, hc, p.metrics); err == nil {
				s.Goroutines = g
			}
		}
		p.Samples = append(p.Samples, s)
	}
}

// progress is one line of counts and the latest figures of the long-lived processes.
func progress(st *stats, ch *churn, pc *poolChurn, procs []*tracked) string {
	st.mu.Lock()
	line := fmt.Sprintf("%d transfers, %d failed (%d during churn)", st.submitted, st.failed, st.failedInChurn)
	st.mu.Unlock()
	ch.mu.Lock()
	line += fmt.Sprintf(", %d agent restarts", ch.cycles)
	ch.mu.Unlock()
	line += fmt.Sprintf(", %d pools", pc.cycles.Load())
	for _, p := range procs {
		if n := len(p.Samples); n > 0 && p.judged {
			s := p.Samples[n-1]
			line += fmt.Sprintf("; %s %d MiB/%s g/%d fds", p.Name, s.RSSKiB>>10, count(s.Goroutines), s.FDs)
		}
	}
	return line
}
