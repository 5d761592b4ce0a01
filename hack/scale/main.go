// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/go-logr/logr"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
	"github.com/fabricxfer/fabricxfer/topology"
)

const nodeLabel = "fabricxfer.io/scale-node"

func main() {
	// client-go logs every timed-out response body through klog; the harness counts failed rounds instead.
	klog.SetLogger(logr.Discard())
	ctrl.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

type options struct {
	nodes           int
	heartbeat       time.Duration
	ramp            time.Duration
	window          time.Duration
	timeout         time.Duration
	qps             float64
	poolNamespace   string
	poolName        string
	operatorPID     int
	apiserverPID    int
	etcdPID         int
	operatorMetrics string
	operatorLog     string
	agentNamespace  string
	agentTokenFile  string
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "nodes" && args[0] != "run" && args[0] != "agent-user") {
		return errors.New("usage: scale nodes|run|agent-user [flags] (see hack/scale.sh)")
	}
	fs := flag.NewFlagSet("scale "+args[0], flag.ContinueOnError)
	var o options
	fs.IntVar(&o.nodes, "n", 100, "simulated nodes")
	fs.DurationVar(&o.heartbeat, "heartbeat", 10*time.Second, "agent heartbeat period (the agent's --heartbeat)")
	fs.DurationVar(&o.ramp, "ramp", 10*time.Second, "agents start spread over this long, as a DaemonSet rollout spreads them")
	fs.DurationVar(&o.window, "window", 30*time.Second, "steady-state window over which request rates are measured")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up when the pool has not converged this long after the last first report")
	fs.Float64Var(&o.qps, "qps", 2000, "client-side rate limit of the client the simulated agents share")
	fs.StringVar(&o.poolNamespace, "pool-namespace", "default", "namespace of the TransferPool")
	fs.StringVar(&o.poolName, "pool-name", "scale", "name of the TransferPool")
	fs.IntVar(&o.operatorPID, "operator-pid", 0, "PID of the operator process, for its peak RSS")
	fs.IntVar(&o.apiserverPID, "apiserver-pid", 0, "PID of the kube-apiserver process, for its CPU time beside the operator's (0: not shown)")
	fs.IntVar(&o.etcdPID, "etcd-pid", 0, "PID of the etcd process, for its CPU time beside the operator's (0: not shown)")
	fs.StringVar(&o.operatorMetrics, "operator-metrics", "", "URL of the operator's metrics endpoint")
	fs.StringVar(&o.operatorLog, "operator-log", "", "the operator's log file, to count its error lines")
	fs.StringVar(&o.agentNamespace, "agent-namespace", controllers.DefaultAgentNamespace, "the operator's --agent-namespace, where the pool's agent ServiceAccount lives")
	fs.StringVar(&o.agentTokenFile, "agent-token-file", "", "bearer token the simulated agents authenticate with, as the pool's agent ServiceAccount "+
		"(hack/scale.sh adds it to the API server's static tokens); empty: the kubeconfig's identity (admin, which API Priority and Fairness exempts)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if args[0] == "agent-user" {
		// The user name the API server gives the pool's agents: hack/scale.sh makes a token for it.
		fmt.Println(agentUser(o))
		return nil
	}
	if o.nodes < 1 || o.heartbeat <= 0 || o.window <= 0 || o.qps <= 0 || o.ramp < 0 {
		return fmt.Errorf("need -n >= 1 and positive -heartbeat, -window, -qps (got %d, %s, %s, %g)", o.nodes, o.heartbeat, o.window, o.qps)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	// The harness's own setup and observer act as the kubeconfig's admin; the simulated agents as the pool's
	// agent ServiceAccount when given its token, so RBAC and API Priority and Fairness treat them as the API
	// server treats real agents (admin is in system:masters, which APF exempts from queueing).
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the admin client: %w", err)
	}
	if args[0] == "nodes" {
		return createNodes(ctx, admin, o.nodes)
	}
	agentAuth := rest.CopyConfig(cfg)
	if o.agentTokenFile != "" {
		raw, err := os.ReadFile(o.agentTokenFile)
		if err != nil {
			return fmt.Errorf("reading the agents' token: %w", err)
		}
		agentAuth = rest.AnonymousClientConfig(cfg)
		agentAuth.BearerToken = strings.TrimSpace(string(raw))
	}
	var agentRequests requestCount
	agentCfg := rest.CopyConfig(agentAuth)
	agentCfg.QPS, agentCfg.Burst = float32(o.qps), int(2*o.qps)
	agentCfg.UserAgent = "fabricxfer-agent-sim"
	agentCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &agentRequests} })
	agents, err := client.New(agentCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the agents' client: %w", err)
	}
	return measure(ctx, o, cfg, scheme, admin, agentAuth, agents, &agentRequests)
}

type countingTransport struct {
	next  http.RoundTripper
	count *requestCount
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.count.add(r.Method + " " + resourceOf(r.URL.Path))
	return c.next.RoundTrip(r)
}

// requestCount counts the simulated agents' requests, in all and by "VERB resource" (apply is PATCH), so the
// heartbeat Leases show beside the TransferNode writes.
type requestCount struct {
	total atomic.Int64
	mu    sync.Mutex
	by    map[string]int64
}

func (c *requestCount) add(kind string) {
	c.total.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]int64{}
	}
	c.by[kind]++
}

func (c *requestCount) Load() int64 { return c.total.Load() }

// byKind is a copy of the counts by kind, as Prometheus-style samples for delta and topN.
func (c *requestCount) byKind() []sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]sample, 0, len(c.by))
	for k, v := range c.by {
		out = append(out, sample{labels: map[string]string{"kind": k}, value: float64(v)})
	}
	return out
}

// resourceOf names the resource (and subresource) of an API path: leases, transfernodes/status, nodes, ...
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...; then namespaces/<ns>/ for namespaced objects.
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "discovery"
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "discovery"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

// createNodes creates Node objects scale-node-00000.. labelled for the pool, 32 at a time.
func createNodes(ctx context.Context, c client.Client, n int) error {
	start := time.Now()
	work := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{
					nodeLabel: "true", "kubernetes.io/hostname": nodeName(i),
				}}}
				if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- fmt.Errorf("creating Node %s: %w", node.Name, err)
				}
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("created %d Node objects in %.1f s\n", n, time.Since(start).Seconds())
	return ctx.Err()
}

// agentSim is one simulated agent: the real reporter with a synthetic detection report.
type agentSim struct {
	rep      *nodesync.Reporter
	firstOK  atomic.Int64 // UnixNano of the first successful report; 0 until then
	failures atomic.Int64
	// failedBy counts the failed rounds by why they failed (failureKind), shared by every agent.
	failedBy *failureCount
}

func (s *agentSim) firstReported() bool { return s.firstOK.Load() != 0 }

func (s *agentSim) firstReportAt() time.Time {
	if ns := s.firstOK.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func measure(ctx context.Context, o options, cfg *rest.Config, scheme *runtime.Scheme, admin client.Client, agentAuth *rest.Config,
	agents client.Client, agentRequests *requestCount) error {
	// The harness watches through its own cache so that polling for convergence costs the API server nothing.
	obsCfg := rest.CopyConfig(cfg)
	obsCfg.QPS, obsCfg.Burst = 50, 100
	watch, err := cache.New(obsCfg, cache.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the observer cache: %w", err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() { _ = watch.Start(watchCtx) }()
	for _, obj := range []client.Object{&v1alpha1.TransferPool{}, &v1alpha1.VPodTopology{}} {
		if _, err := watch.GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	// The reports too, through a watch like the operator's: when a watcher on this machine first saw each
	// node's report, so a slow operator can be told from a watch that delivers late.
	seen := &reportsSeen{}
	tnInformer, err := watch.GetInformer(ctx, &v1alpha1.TransferNode{})
	if err != nil {
		return fmt.Errorf("watching TransferNodes: %w", err)
	}
	if _, err := tnInformer.AddEventHandler(seen.handler()); err != nil {
		return fmt.Errorf("watching TransferNodes: %w", err)
	}
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !watch.WaitForCacheSync(syncCtx) {
		return errors.New("the observer cache did not sync within a minute")
	}

	expected := expectedDomains(o.nodes)
	kinds := map[domainKind]int{}
	for _, d := range expected {
		kinds[d.kind]++
	}
	fmt.Printf("cluster: %d nodes x %d GPUs, %d NICs each; %d scale-up domains (nvlink72 %d, ualink18 %d, ualink4 %d)\n",
		o.nodes, gpusPerNode, nicsPerNode, len(expected), kinds[nvlink72], kinds[ualink18], kinds[ualink4])

	hb := int32(math.Round(o.heartbeat.Seconds()))
	if hb < 1 {
		hb = 1
	}
	pool := &v1alpha1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Name: o.poolName, Namespace: o.poolNamespace},
		Spec: v1alpha1.TransferPoolSpec{
			NodeSelector:      map[string]string{nodeLabel: "true"},
			AllowedNamespaces: []string{o.poolNamespace},
			Agent:             v1alpha1.AgentSpec{HeartbeatSeconds: hb},
		},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a REST client: %w", err)
	}
	latency0, err := apiLatency(ctx, cs)
	if err != nil {
		return err
	}
	apf0, err := scrapeAPF(ctx, cs)
	if err != nil {
		return err
	}
	cpu := func() float64 {
		if o.operatorPID <= 0 {
			return math.NaN()
		}
		s, err := procCPUSeconds(o.operatorPID)
		if err != nil {
			return math.NaN()
		}
		return s
	}
	cpu0 := cpu()
	// Everything on this machine that the measured seconds share its cores with: a run whose convergence is
	// slow says whether the API server, etcd, the operator or this harness had the cores.
	procs := processesOf(o)
	procs0 := procs.cpu()
	queues := func() (queueSnapshot, bool) {
		if o.operatorMetrics == "" {
			return queueSnapshot{}, false
		}
		q, err := scrapeQueues(ctx, o.operatorMetrics)
		if err != nil {
			fmt.Printf("operator queues: %v\n", err)
			return queueSnapshot{}, false
		}
		return q, true
	}
	queuesCreated, okCreated := queues()
	if err := admin.Create(ctx, pool); err != nil {
		return fmt.Errorf("creating TransferPool %s/%s: %w", o.poolNamespace, o.poolName, err)
	}
	poolApplied := time.Now()
	who, err := waitAgentsAllowed(ctx, o, admin, agentAuth)
	if err != nil {
		return err
	}
	fmt.Printf("simulated agents act as %s; their DaemonSet and rights in place %.2f s after the pool was created\n",
		who, time.Since(poolApplied).Seconds())

	failedBy := &failureCount{}
	sims := make([]*agentSim, o.nodes)
	var running, firstDone sync.WaitGroup
	firstDone.Add(o.nodes)
	for i := range sims {
		rep := syntheticReport(i, expected)
		sim := &agentSim{failedBy: failedBy}
		r, err := nodesync.New(nodesync.Config{
			NodeName: nodeName(i), PoolNamespace: o.poolNamespace, PoolName: o.poolName, Period: o.heartbeat,
			Identity: nodestatus.Identity{AgentVersion: "v0.1.0", Endpoint: fmt.Sprintf("10.%d.%d.%d:7470", 1+i/65536, (i/256)%256, i%256)},
			Detect:   func(context.Context) (topology.Report, error) { return rep, nil },
			Client:   agents, Log: logr.Discard(),
			AfterRound: sim.afterRound(&firstDone),
		})
		if err != nil {
			return fmt.Errorf("simulated agent %d: %w", i, err)
		}
		sim.rep = r
		sims[i] = sim
	}
	agentCtx, stopAgents := context.WithCancel(ctx)
	for i, s := range sims {
		running.Add(1)
		go func() {
			defer running.Done()
			s.loop(agentCtx, time.Duration(int64(o.ramp)*int64(i)/int64(o.nodes)))
		}()
	}
	defer func() { stopAgents(); running.Wait() }()

	firstCtx, cancelFirst := context.WithTimeout(ctx, o.ramp+10*o.heartbeat)
	defer cancelFirst()
	firstErr := waitGroup(firstCtx, &firstDone)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	lastFirst, reported := poolApplied, 0
	for _, s := range sims {
		if s.firstReported() {
			reported++
		}
		if t := s.firstReportAt(); t.After(lastFirst) {
			lastFirst = t
		}
	}
	fmt.Printf("observer watch: %s\n", seen.report(sims, lastFirst))
	var (
		converged time.Time
		detail    string
		convErr   error
	)
	if firstErr != nil {
		// Still measure: the rates and memory of a cluster that cannot take every first report say why.
		convErr = fmt.Errorf("%d of %d simulated agents never reported within %s: %w", o.nodes-reported, o.nodes, o.ramp+10*o.heartbeat, firstErr)
		detail = "first reports incomplete"
		fmt.Printf("NOT every agent reported: %v\n", convErr)
	} else {
		fmt.Printf("all %d agents reported once; the last %.1f s after the pool was created\n", o.nodes, lastFirst.Sub(poolApplied).Seconds())
		queuesFirst, okFirst := queues()
		converged, detail, convErr = waitConverged(ctx, watch, o, expected, lastFirst.Add(o.timeout))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if queuesDone, okDone := queues(); okCreated && okFirst && okDone {
			for _, l := range queueReport(queuesCreated, queuesFirst) {
				fmt.Printf("operator, pool created to last first report: %s\n", l)
			}
			for _, l := range queueReport(queuesFirst, queuesDone) {
				fmt.Printf("operator, last first report to converged: %s\n", l)
			}
		}
	}
	convergeS := math.Max(0, converged.Sub(lastFirst).Seconds())
	if convErr != nil && firstErr == nil {
		// Still measure: the rates and memory of a cluster that does not converge say why.
		fmt.Printf("NOT converged %s after the last first report: %s\n", o.timeout, detail)
	} else if convErr == nil {
		fmt.Printf("converged %.2f s after the last first report (%.1f s after the pool was created): %s\n",
			convergeS, converged.Sub(poolApplied).Seconds(), detail)
	}

	latency1, err := apiLatency(ctx, cs)
	if err != nil {
		return err
	}
	printOperatorWrites(latency0, latency1)
	apf1, err := scrapeAPF(ctx, cs)
	if err != nil {
		return err
	}
	for _, l := range apfReport(apf0, apf1) {
		fmt.Printf("API Priority and Fairness, pool created to converged: %s\n", l)
	}
	cpu1, at1 := cpu(), time.Now()
	fmt.Printf("operator CPU from pool creation to convergence: %.2f s in %.1f s\n", cpu1-cpu0, at1.Sub(poolApplied).Seconds())
	fmt.Printf("CPU by process from pool creation to convergence: %s\n", procs.report(procs0, procs.cpu(), at1.Sub(poolApplied)))

	size, stripped, err := transferNodeSize(ctx, cfg, nodeName(0))
	if err != nil {
		return err
	}
	fmt.Printf("TransferNode %s (8 GPUs, 8 NICs): %d bytes of JSON as the API server returns it, %d without managedFields (goal < 8192)\n",
		nodeName(0), size, stripped)

	cpu2, at2 := cpu(), time.Now()
	procs2 := procs.cpu()
	rate, err := steadyState(ctx, o, cfg, agentRequests)
	if err != nil {
		return err
	}
	cpu3, at3 := cpu(), time.Now()
	fmt.Printf("CPU by process in the steady state: %s\n", procs.report(procs2, procs.cpu(), at3.Sub(at2)))
	fmt.Printf("operator CPU in the steady state: %.2f s in %.1f s (%.1f %% of a core)\n", cpu3-cpu2, at3.Sub(at2).Seconds(),
		100*(cpu3-cpu2)/at3.Sub(at2).Seconds())
	if err := printVPodSlices(ctx, cs, len(expected)); err != nil {
		return err
	}
	failures := int64(0)
	for _, s := range sims {
		failures += s.failures.Load()
	}
	fmt.Printf("agent report rounds that failed: %d\n", failures)
	if failures > 0 {
		fmt.Printf("agent report rounds that failed, by cause: %s\n", failedBy.String())
	}
	var since []string
	for _, r := range agentRequests.byKind() {
		since = append(since, fmt.Sprintf("%s: %.0f", r.labels["kind"], r.value))
	}
	sort.Strings(since)
	fmt.Printf("simulated agents' requests since start: %v\n", since)

	rssMiB := math.NaN()
	if o.operatorPID > 0 {
		hwm, err := procMemKiB(o.operatorPID, "VmHWM")
		if err != nil {
			return err
		}
		cur, err := procMemKiB(o.operatorPID, "VmRSS")
		if err != nil {
			return err
		}
		rssMiB = float64(hwm) / 1024
		fmt.Printf("operator memory: peak RSS (VmHWM) %.1f MiB, current RSS %.1f MiB (goal <= 150 MiB peak)\n", rssMiB, float64(cur)/1024)
	}
	if o.operatorLog != "" {
		n, err := countErrorLines(o.operatorLog)
		if err != nil {
			return err
		}
		fmt.Printf("operator log: %d error lines\n", n)
		kinds, err := errorKinds(o.operatorLog, 5)
		if err != nil {
			return err
		}
		for _, k := range kinds {
			fmt.Printf("  %s\n", k)
		}
	}
	if convErr != nil {
		fmt.Printf("did not converge %d nodes (%s), operator RSS %.0f MiB, API %.1f req/s\n", o.nodes, detail, rssMiB, rate)
		return fmt.Errorf("%w (%s)", convErr, detail)
	}
	fmt.Printf("converged %d nodes in %.1f s, operator RSS %.0f MiB, API %.1f req/s\n", o.nodes, convergeS, rssMiB, rate)
	return nil
}

// loop runs the agent's real Reporter.Run after the ramp delay, timing the first successful round and
// counting failed ones.
func (s *agentSim) loop(ctx context.Context, delay time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(delay):
	}
	_ = s.rep.Run(ctx)
}

// afterRound is the reporter's AfterRound hook.
func (s *agentSim) afterRound(firstDone *sync.WaitGroup) func(error) {
	return func(err error) {
		if err != nil {
			s.failures.Add(1)
			s.failedBy.add(failureKind(err))
		} else if s.firstOK.CompareAndSwap(0, time.Now().UnixNano()) {
			firstDone.Done()
		}
	}
}

func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitConverged polls the watch cache until the pool counts every node ready and every expected domain lists
// all its members, and returns when it first saw that.
func waitConverged(ctx context.Context, watch cache.Cache, o options, expected map[string]domainShape, deadline time.Time) (time.Time, string, error) {
	names := make(map[string]int, len(expected))
	for k, d := range expected {
		names[v1alpha1.DomainObjectName(k)] = d.nodes
	}
	detail := "nothing observed yet"
	var lastProgress time.Time // the first line shows what the last first report left to do
	began := time.Now()
	var poolReady, vpodsComplete time.Time
	opRate := operatorRate{url: o.operatorMetrics, at: time.Now()}
	opRate.next(ctx)
	for {
		var pool v1alpha1.TransferPool
		var vps v1alpha1.VPodTopologyList
		if err := watch.Get(ctx, client.ObjectKey{Namespace: o.poolNamespace, Name: o.poolName}, &pool); err != nil {
			return time.Time{}, detail, fmt.Errorf("reading the pool from the watch cache: %w", err)
		}
		// Read in place: a copy of 832 vPODs every 20 ms took 8 % of a core from the machine the API server
		// and the operator share, during the very seconds that are measured.
		if err := watch.List(ctx, &vps, client.UnsafeDisableDeepCopy); err != nil {
			return time.Time{}, detail, fmt.Errorf("listing vPODs from the watch cache: %w", err)
		}
		complete, short, missing := 0, 0, 0
		for _, vp := range vps.Items {
			want, ok := names[vp.Name]
			switch {
			case !ok:
			case int(vp.Status.Nodes) == want && len(vp.Status.MissingMembers) == 0:
				complete++
			case len(vp.Status.MissingMembers) > 0:
				missing++
			default:
				short++
			}
		}
		ready := pool.Status.ReadyNodes == int32(o.nodes) && pool.Status.DesiredNodes == int32(o.nodes)
		if ready && poolReady.IsZero() {
			poolReady = time.Now()
		}
		if complete == len(expected) && vpodsComplete.IsZero() {
			vpodsComplete = time.Now()
		}
		detail = fmt.Sprintf("pool %d/%d ready, %d of %d vPODs complete", pool.Status.ReadyNodes, pool.Status.DesiredNodes, complete, len(expected))
		if ready && complete == len(expected) {
			return time.Now(), fmt.Sprintf("%s; pool ready %.2f s, vPODs complete %.2f s after waiting began", detail,
				poolReady.Sub(began).Seconds(), vpodsComplete.Sub(began).Seconds()), nil
		}
		if time.Since(lastProgress) >= 5*time.Second {
			// Why not yet: vPODs listing fewer members than the layout has, or naming stale members; the pool's
			// first not-ready nodes.
			fmt.Printf("  waiting: %s (%d vPODs short of members, %d with stale members; pool not ready: %v; %d vPODs exist)%s\n",
				detail, short, missing, firstOf(pool.Status.NotReadyNodes, 3), len(vps.Items), opRate.next(ctx))
			lastProgress = time.Now()
		}
		if time.Now().After(deadline) {
			return time.Time{}, detail, errors.New("pool and vPODs did not converge before the deadline")
		}
		select {
		case <-ctx.Done():
			return time.Time{}, detail, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// operatorRate says what the operator's client sent since it was last asked, by method, so the waiting lines
// show whether the operator is busy writing or idle.
type operatorRate struct {
	url  string
	at   time.Time
	last []sample
}

func (r *operatorRate) next(ctx context.Context) string {
	if r.url == "" {
		return ""
	}
	raw, err := scrape(ctx, r.url)
	if err != nil {
		return fmt.Sprintf(" (operator metrics: %v)", err)
	}
	now, err := parseCounter(raw, "rest_client_requests_total")
	if err != nil {
		return fmt.Sprintf(" (operator metrics: %v)", err)
	}
	window := time.Since(r.at)
	line := fmt.Sprintf("; operator %v", topN(delta(r.last, now, "method"), 4, window))
	r.last, r.at = now, time.Now()
	return line
}

// countErrorLines counts the error-level lines of a JSON (zap) log.
func countErrorLines(path string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading the operator log: %w", err)
	}
	return bytes.Count(raw, []byte(`"level":"error"`)), nil
}

// transferNodeSize reads one TransferNode as raw JSON: its size as stored and served, and without the
// managedFields that server-side apply adds (what a client that strips them keeps in memory).
func transferNodeSize(ctx context.Context, cfg *rest.Config, name string) (int, int, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("creating a REST client: %w", err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "transfernodes", name).DoRaw(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("reading TransferNode %s: %w", name, err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return 0, 0, fmt.Errorf("decoding TransferNode %s: %w", name, err)
	}
	compact, err := json.Marshal(obj)
	if err != nil {
		return 0, 0, fmt.Errorf("encoding TransferNode %s: %w", name, err)
	}
	if meta, ok := obj["metadata"].(map[string]any); ok {
		delete(meta, "managedFields")
	}
	stripped, err := json.Marshal(obj)
	if err != nil {
		return 0, 0, fmt.Errorf("encoding TransferNode %s: %w", name, err)
	}
	return len(compact), len(stripped), nil
}

// apiLatency reads the API server's request latency histogram (apiserver_request_duration_seconds).
func apiLatency(ctx context.Context, cs kubernetes.Interface) ([]sample, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	return parseCounter(raw, "apiserver_request_duration_seconds_bucket")
}

// printOperatorWrites prints the API server's own latency of the operator's writes between two scrapes: the
// writes of VPodTopologies, TransferPools and ResourceSlices (the vPOD devices), which no other client of the
// harness writes (agents write TransferNodes and Leases).
func printOperatorWrites(before, after []sample) {
	writes := func(l map[string]string) bool {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
			return l["resource"] == "vpodtopologies" || l["resource"] == "transferpools" || l["resource"] == "resourceslices"
		}
		return false
	}
	lat := histogramQuantiles(before, after, writes, "verb", "resource", "subresource")
	if len(lat) == 0 {
		fmt.Println("operator writes (API server latency, pool created to converged): none seen")
		return
	}
	for _, l := range lat {
		fmt.Printf("operator writes (API server latency, pool created to converged): %s n=%.0f p50 %s p90 %s p99 %s\n",
			l.kind, l.count, ms(l.p50), ms(l.p90), ms(l.p99))
	}
	// Every client's writes, so the operator's share of what the API server did is seen (agents' reports and
	// Leases, Events, the controller manager's), and every client's reads beside them (GET and LIST; watches are
	// long-running and left out), which a slow start-up has more of.
	printAllRequests(before, after, "all writes", "POST", "PUT", "PATCH", "APPLY", "DELETE")
	printAllRequests(before, after, "all reads", "GET", "LIST")
}

// printAllRequests prints the API server's count and median latency of every client's requests of the given
// verbs between two scrapes, by verb, resource and subresource.
func printAllRequests(before, after []sample, label string, verbs ...string) {
	all := histogramQuantiles(before, after, func(l map[string]string) bool {
		return slices.Contains(verbs, l["verb"])
	}, "verb", "resource", "subresource")
	parts := make([]string, 0, len(all))
	total := 0.0
	for _, l := range all {
		total += l.count
		parts = append(parts, fmt.Sprintf("%s n=%.0f p50 %s", l.kind, l.count, ms(l.p50)))
	}
	fmt.Printf("%s (API server, pool created to converged): %.0f: %s\n", label, total, strings.Join(parts, "; "))
}

// steadyState measures request rates over the window: the API server's apiserver_request_total (every client,
// long-running WATCH requests left out), the operator's rest_client_requests_total and the simulated agents'
// own count. It returns the API server's total rate.
func steadyState(ctx context.Context, o options, cfg *rest.Config, agentRequests *requestCount) (float64, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, fmt.Errorf("creating a REST client: %w", err)
	}
	apiMetrics := func() ([]sample, error) {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the API server's metrics: %w", err)
		}
		return parseCounter(raw, "apiserver_request_total")
	}
	opMetrics := func() ([]sample, error) {
		if o.operatorMetrics == "" {
			return nil, nil
		}
		raw, err := scrape(ctx, o.operatorMetrics)
		if err != nil {
			return nil, err
		}
		return parseCounter(raw, "rest_client_requests_total")
	}
	api0, err := apiMetrics()
	if err != nil {
		return 0, err
	}
	op0, err := opMetrics()
	if err != nil {
		return 0, err
	}
	ag0, agBy0, t0 := agentRequests.Load(), agentRequests.byKind(), time.Now()
	fmt.Printf("measuring steady state for %s ...\n", o.window)
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(o.window):
	}
	api1, err := apiMetrics()
	if err != nil {
		return 0, err
	}
	op1, err := opMetrics()
	if err != nil {
		return 0, err
	}
	window := time.Since(t0)
	agentRate := float64(agentRequests.Load()-ag0) / window.Seconds()

	var long0, long1 []sample // WATCH and CONNECT are long-running: counted when they start, not load per second
	for _, s := range api0 {
		if s.labels["verb"] != "WATCH" && s.labels["verb"] != "CONNECT" {
			long0 = append(long0, s)
		}
	}
	for _, s := range api1 {
		if s.labels["verb"] != "WATCH" && s.labels["verb"] != "CONNECT" {
			long1 = append(long1, s)
		}
	}
	byCall := delta(long0, long1, "verb", "resource", "subresource")
	total := sum(byCall) / window.Seconds()
	fmt.Printf("steady state over %.1f s: API server %.1f req/s (WATCH left out); simulated agents %.1f req/s (%.3f per agent per heartbeat)\n",
		window.Seconds(), total, agentRate, agentRate*o.heartbeat.Seconds()/float64(o.nodes))
	agentKinds := topN(delta(agBy0, agentRequests.byKind(), "kind"), 6, window)
	fmt.Printf("simulated agents' requests: %v\n", agentKinds)
	if o.operatorMetrics != "" {
		opRate := sum(delta(op0, op1, "method")) / window.Seconds()
		byMethod := topN(delta(op0, op1, "method", "code"), 6, window)
		sort.Strings(byMethod)
		fmt.Printf("operator client: %.1f req/s %v\n", opRate, byMethod)
	}
	for _, line := range topN(byCall, 8, window) {
		fmt.Printf("  api %s\n", line)
	}
	return total, nil
}

// printVPodSlices counts the operator's vPOD ResourceSlices (driver fabricxfer.io, bound to no node) and their
// devices, a page at a time, so a lean operator is seen to have published them all.
func printVPodSlices(ctx context.Context, cs kubernetes.Interface, domains int) error {
	opts := metav1.ListOptions{Limit: 100, FieldSelector: fields.Set{
		resourceapi.ResourceSliceSelectorDriver: v1alpha1.DRADriverName, resourceapi.ResourceSliceSelectorNodeName: ""}.String()}
	slices, devices := 0, 0
	for {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, opts)
		if err != nil {
			return fmt.Errorf("listing the vPOD ResourceSlices: %w", err)
		}
		for _, s := range l.Items {
			slices++
			devices += len(s.Spec.Devices)
		}
		if opts.Continue = l.Continue; opts.Continue == "" {
			break
		}
	}
	fmt.Printf("vPOD ResourceSlices: %d for %d scale-up domains, %d devices\n", slices, domains, devices)
	return nil
}

// firstOf is at most the first n of names.
func firstOf(names []string, n int) []string {
	return names[:min(n, len(names))]
}
