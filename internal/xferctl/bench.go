// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// latency summarizes one measured path.
type latency struct {
	Path       string  `json:"path"`
	Iterations int     `json:"iterations"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	MeanUs     float64 `json:"mean_us"`
	MaxUs      float64 `json:"max_us"`
}

func summarize(path string, d []time.Duration) latency {
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1e3 }
	pick := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return latency{Path: path, Iterations: len(d), P50us: us(pick(0.50)), P99us: us(pick(0.99)),
		MeanUs: us(sum / time.Duration(len(d))), MaxUs: us(d[len(d)-1])}
}

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "agent socket to measure (default: start a local agent process for the run)")
	sizeFlag := fs.String("size", "4Ki", "bytes per transfer")
	iterations := fs.Int("iterations", 20000, "measured transfers per path")
	warmup := fs.Int("warmup", 2000, "unmeasured transfers per path first")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	spin := fs.Duration("spin", client.DefaultSpin, "how long the client and the local agent poll the fast socket before sleeping (0: never)")
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	size, err := parseSize(*sizeFlag)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *iterations < 1 || *warmup < 0 {
		return fmt.Errorf("--iterations must be positive and --warmup not negative")
	}
	path := *socket
	agentProc := "given socket"
	if path == "" {
		var stop func()
		path, stop, err = spawnLocalAgent(ctx, stderr, *spin)
		if err != nil {
			return err
		}
		defer stop()
		agentProc = "local agent process"
	}
	var results []latency
	viaSocket, err := benchSocket(ctx, path, size, *warmup, *iterations, *spin)
	if err != nil {
		return err
	}
	results = append(results, viaSocket...)
	direct, err := benchDirect(ctx, size, *warmup, *iterations)
	if err != nil {
		return err
	}
	results = append(results, direct)
	echo, err := benchUnixEcho(*warmup, *iterations)
	if err != nil {
		return err
	}
	results = append(results, echo)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"size_bytes": size, "agent": agentProc, "spin": spin.String(), "results": results})
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%d-byte transfers between two host regions on one node (%s, fast-socket spin %s)\n", size, agentProc, *spin)
	fmt.Fprintln(tw, "PATH\tN\tP50 µs\tP99 µs\tMEAN µs\tMAX µs")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\n", r.Path, r.Iterations, r.P50us, r.P99us, r.MeanUs, r.MaxUs)
	}
	return tw.Flush()
}

// spawnLocalAgent starts "xferctl local-agent" as a separate process on a temporary socket directory, so the
// measured path crosses processes as it does for an inference pod.
func spawnLocalAgent(ctx context.Context, stderr io.Writer, spin time.Duration) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("finding this executable to start a local agent: %w", err)
	}
	dir, err := os.MkdirTemp("", "xferctl-bench")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.CommandContext(ctx, self, "local-agent", "--socket-dir", dir, "--pool", "bench", "--node-name", "bench",
		"--fast-spin", spin.String())
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("starting a local agent: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(dir)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready:") {
				ready <- nil
				io.Copy(io.Discard, out)
				return
			}
		}
		ready <- fmt.Errorf("local agent exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return "", nil, err
		}
	case <-time.After(15 * time.Second):
		stop()
		return "", nil, fmt.Errorf("local agent not ready within 15 s")
	}
	return filepath.Join(dir, "bench", "agent.sock"), stop, nil
}

// benchClient is a client of the agent at path with both halves of m registered (size bytes each).
type benchClient struct {
	c        *client.Client
	src, dst *client.Region
}

func dialBench(ctx context.Context, path string, m *client.SharedMemory, size uint64, opts ...client.Option) (benchClient, error) {
	c, err := client.Dial(ctx, path, opts...)
	if err != nil {
		return benchClient{}, err
	}
	b := benchClient{c: c}
	if b.src, err = c.RegisterHost(ctx, m.File, 0, size); err == nil {
		b.dst, err = c.RegisterHost(ctx, m.File, size, size)
	}
	if err != nil {
		c.Close()
		return benchClient{}, err
	}
	return b, nil
}

// do is one waited transfer of the source half to the destination half on the fast socket (client.Do).
func (b benchClient) do(ctx context.Context) error {
	_, err := b.c.Do(ctx, client.Write, []client.Item{{Local: b.src, Remote: client.ToRegion(b.dst), Length: b.src.Len()}}, client.TransferOptions{})
	return err
}

func benchSocket(ctx context.Context, path string, size uint64, warmup, n int, spin time.Duration) ([]latency, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := client.NewSharedMemory("bench", 2*size)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	b, err := dialBench(dctx, path, m, size, client.WithName("xferctl-bench"), client.WithSpin(spin))
	if err != nil {
		return nil, err
	}
	defer b.c.Close()
	// The same call from a client whose frames stay on the socket (no mailbox), beside it.
	sb, err := dialBench(dctx, path, m, size, client.WithName("xferctl-bench-socket"), client.WithSpin(spin), client.WithoutMailbox())
	if err != nil {
		return nil, err
	}
	defer sb.c.Close()
	c, src, dst := b.c, b.src, b.dst
	items := []client.Item{{Local: src, Remote: client.ToRegion(dst), Length: size}}
	fastTrip := func() error { return b.do(ctx) }
	socketTrip := func() error { return sb.do(ctx) }
	// The same request as a gRPC call, for comparison with the fast socket.
	grpcTransfer := func(wait bool) (*agentv1.TransferResponse, error) {
		return c.API().Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_WRITE, Wait: wait,
			Items: []*agentv1.TransferItem{{LocalRegionId: src.ID(), Length: size,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: dst.ID()}}}}})
	}
	oneTrip := func() error { _, err := grpcTransfer(true); return err }
	twoTrips := func() error {
		resp, err := grpcTransfer(false)
		if err != nil {
			return err
		}
		_, err = c.API().Wait(ctx, &agentv1.WaitRequest{TransferId: resp.TransferId})
		return err
	}
	fastTwoTrips := func() error {
		t, err := c.Submit(ctx, client.Write, items, client.TransferOptions{})
		if err != nil {
			return err
		}
		_, err = t.Wait(ctx)
		return err
	}
	info := func() error { _, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); return err }
	var out []latency
	for _, p := range []struct {
		name string
		fn   func() error
	}{
		{"fast socket, mailbox: Transfer(wait) — client.Do", fastTrip},
		{"fast socket, frames on the socket: the same", socketTrip},
		{"fast socket, mailbox: Submit + Wait — 2 round trips", fastTwoTrips},
		{"gRPC: Transfer(wait) — 1 round trip", oneTrip},
		{"gRPC: Transfer + Wait — 2 round trips", twoTrips},
		{"gRPC: GetInfo — 1 round trip, no transfer", info},
	} {
		d, err := measure(p.fn, warmup, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		out = append(out, summarize(p.name, d))
	}
	return out, nil
}

// benchDirect measures the same copy as a direct in-process call of the composite engine: plan, submit, wait.
func benchDirect(ctx context.Context, size uint64, warmup, n int) (latency, error) {
	regions := engines.NewRegistry("bench", 0) // one table, as the agent keeps it
	x, err := xgmi.New(xgmi.Options{Node: "bench", Registry: regions}, xgmi.NewHostBackend())
	if err != nil {
		return latency{}, err
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "bench", Registry: regions}, x)
	if err != nil {
		return latency{}, err
	}
	defer comp.Close()
	buf := make([]byte, 2*size)
	for i, id := range []engines.MemoryID{"bench/src", "bench/dst"} {
		if _, err := comp.Register(ctx, engines.MemoryDesc{ID: id, Node: "bench", Location: engines.Location{Kind: engines.LocationHost},
			Size: size, Handles: engines.Handles{Host: buf[uint64(i)*size : uint64(i+1)*size]}}); err != nil {
			return latency{}, err
		}
	}
	once := func() error {
		b := comp.NewPlan()
		if err := b.Add(engines.Item{Src: "bench/src", Dst: "bench/dst", Size: size}); err != nil {
			return err
		}
		t, err := comp.Submit(ctx, b.Build(), engines.SubmitOptions{})
		if err != nil {
			return err
		}
		return t.Wait(ctx)
	}
	d, err := measure(once, warmup, n)
	if err != nil {
		return latency{}, fmt.Errorf("direct engine call: %w", err)
	}
	return summarize("direct in-process engine call (plan, submit, wait)", d), nil
}

func measure(fn func() error, warmup, n int) ([]time.Duration, error) {
	for range warmup {
		if err := fn(); err != nil {
			return nil, err
		}
	}
	d := make([]time.Duration, n)
	for i := range d {
		start := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		d[i] = time.Since(start)
	}
	return d, nil
}

// benchUnixEcho is the floor any socket protocol pays on this machine: a 64-byte request and reply over a
// Unix socket between two goroutines of this process.
func benchUnixEcho(warmup, n int) (latency, error) {
	a, b, err := socketPair()
	if err != nil {
		return latency{}, err
	}
	defer a.Close()
	defer b.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(b, buf); err != nil {
				return
			}
			if _, err := b.Write(buf); err != nil {
				return
			}
		}
	}()
	msg, reply := make([]byte, 64), make([]byte, 64)
	d, err := measure(func() error {
		if _, err := a.Write(msg); err != nil {
			return err
		}
		_, err := io.ReadFull(a, reply)
		return err
	}, warmup, n)
	if err != nil {
		return latency{}, fmt.Errorf("unix socket echo: %w", err)
	}
	return summarize("baseline: 64-byte echo over a Unix socket (in process)", d), nil
}

func socketPair() (net.Conn, net.Conn, error) {
	dir, err := os.MkdirTemp("", "xferctl-echo")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("unix", filepath.Join(dir, "echo.sock"))
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("unix", filepath.Join(dir, "echo.sock"))
	if err != nil {
		return nil, nil, err
	}
	b, ok := <-accepted
	if !ok {
		a.Close()
		return nil, nil, fmt.Errorf("echo socket accept failed")
	}
	return a, b, nil
}
