// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// cluster is node-a (a composite of xgmi and tcp, the engine under test) and node-b (a tcp engine) on loopback.
type cluster struct {
	a       *engines.Composite
	b       *tcp.Engine
	gate    *enginetest.Gate
	metrics *engines.Metrics
	next    atomic.Uint64
}

// newCluster builds node-a as the agent does: one registry, owned by the composite and shared by its engines.
func newCluster(t *testing.T) *cluster { t.Helper(); return newClusterOn(t, true) }

// newClusterOn builds node-a with one shared registry, or (shared false) with engines built standalone, each
// keeping its own registry beside the composite's.
func newClusterOn(t *testing.T, shared bool) *cluster {
	t.Helper()
	c := &cluster{gate: &enginetest.Gate{}, metrics: engines.NewMetrics()}
	var regions *engines.Registry
	if shared {
		regions = engines.NewRegistry("node-a", 0)
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	x, err := xgmi.New(xgmi.Options{Node: "node-a", CheckDisjoint: true, Registry: regions}, enginetest.GatedHost{HostBackend: xgmi.NewHostBackend(), Gate: c.gate})
	if err != nil {
		t.Fatal(err)
	}
	ta, err := tcp.New(tcp.Options{Node: "node-a", Listener: listen(), ChunkBytes: 64 << 10, Logf: t.Logf, Registry: regions})
	if err != nil {
		t.Fatal(err)
	}
	c.b, err = tcp.New(tcp.Options{Node: "node-b", Listener: c.gate.Listener(listen()), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	c.a, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a", Metrics: c.metrics, Registry: regions}, ta, x)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.a.Close(); c.b.Close() })
	return c
}

func hostDesc(id, node string, buf []byte) engines.MemoryDesc {
	return engines.MemoryDesc{ID: engines.MemoryID(id), Node: node, Location: engines.Location{Kind: engines.LocationHost},
		Size: uint64(len(buf)), Handles: engines.Handles{Host: buf}}
}

// remoteRegion registers buf on node-b and imports it into node-a through the wire encoding.
func (c *cluster) remoteRegion(t testing.TB, buf []byte) engines.MemoryDesc {
	t.Helper()
	d, err := c.b.Register(context.Background(), hostDesc(fmt.Sprintf("node-b/%d", c.next.Add(1)), "node-b", buf))
	if err != nil {
		t.Fatal(err)
	}
	wire, err := engines.MarshalDesc(d)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := engines.UnmarshalDesc(wire)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.a.Import(context.Background(), remote); err != nil {
		t.Fatal(err)
	}
	return remote
}

func (c *cluster) localRegion(t testing.TB, buf []byte) engines.MemoryDesc {
	t.Helper()
	d, err := c.a.Register(context.Background(), hostDesc(fmt.Sprintf("node-a/%d", c.next.Add(1)), "node-a", buf))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCompositeContract(t *testing.T) { compositeContract(t, newCluster(t)) }

// TestCompositeContractSeparateRegistries runs the contract against a composite over engines built standalone,
// each with a registry of its own, to which the composite hands items for planning.
func TestCompositeContractSeparateRegistries(t *testing.T) {
	compositeContract(t, newClusterOn(t, false))
}

func compositeContract(t *testing.T, c *cluster) {
	enginetest.Run(t, enginetest.Harness{
		Engine:     c.a,
		Directions: []engines.Direction{engines.DirLocal, engines.DirWrite, engines.DirRead},
		NewPair: func(t testing.TB, dir engines.Direction, size uint64) enginetest.Pair {
			srcBuf, dstBuf := make([]byte, size), make([]byte, size)
			var src, dst engines.MemoryDesc
			switch dir {
			case engines.DirLocal:
				src, dst = c.localRegion(t, srcBuf), c.localRegion(t, dstBuf)
			case engines.DirWrite:
				src, dst = c.localRegion(t, srcBuf), c.remoteRegion(t, dstBuf)
			default:
				src, dst = c.remoteRegion(t, srcBuf), c.localRegion(t, dstBuf)
			}
			// node-b's memory is touched by its serving goroutines, ordered with this test only through the
			// socket, which the race detector does not see; pinning the region there orders them.
			touch := func(d engines.MemoryDesc, f func()) {
				if d.Node == "node-b" {
					_, unpin, err := c.b.Pin(d.ID)
					if err != nil {
						t.Fatalf("pinning %s: %v", d.ID, err)
					}
					defer unpin()
				}
				f()
			}
			return enginetest.Pair{Src: src.ID, Dst: dst.ID, Size: size,
				Fill: func(off uint64, b []byte) { touch(src, func() { copy(srcBuf[off:], b) }) },
				Read: func(off, n uint64) (out []byte) {
					touch(dst, func() { out = append([]byte(nil), dstBuf[off:off+n]...) })
					return out
				}}
		},
		Gate: c.gate.Shut,
		SetDstNotify: func(dir engines.Direction, fn engines.NotifyFunc) {
			if dir == engines.DirWrite {
				c.b.SetNotifyHandler(fn)
			} else {
				c.a.SetNotifyHandler(fn)
			}
		},
	})
}

// TestEnginesDisjoint asks every engine about every pair of region kinds: no pair is claimed twice, and the
// pairs the CPU engines should move are claimed.
func TestEnginesDisjoint(t *testing.T) {
	c := newCluster(t)
	buf := func() []byte { return make([]byte, 64) }
	local := hostDesc("node-a/h", "node-a", buf())
	localNoView := hostDesc("node-a/nv", "node-a", nil)
	localNoView.Size = 64
	localRDMA := hostDesc("node-a/r", "node-a", buf())
	localRDMA.Handles.RDMA = []engines.RDMAKey{{Device: "mlx5_0", Addr: 4096, RKey: 1}}
	gpuNV := engines.MemoryDesc{ID: "node-a/g0", Node: "node-a", Size: 64,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}, FabricDomain: "nvlink:abc.1"}
	gpuAMD := engines.MemoryDesc{ID: "node-a/g1", Node: "node-a", Size: 64,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorAMD, Device: 1}}
	remote := engines.MemoryDesc{ID: "node-b/h", Node: "node-b", Size: 64, Location: engines.Location{Kind: engines.LocationHost},
		Handles: engines.Handles{TCP: "127.0.0.1:9"}}
	remoteNoTCP := remote
	remoteNoTCP.ID, remoteNoTCP.Handles.TCP = "node-b/x", ""
	remoteRDMA := remote
	remoteRDMA.ID, remoteRDMA.Handles.RDMA = "node-b/r", []engines.RDMAKey{{Device: "mlx5_1", Addr: 8192, RKey: 2}}
	remoteGPU := engines.MemoryDesc{ID: "node-b/g", Node: "node-b", Size: 64, FabricDomain: "nvlink:abc.1",
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles:  engines.Handles{Fabric: &engines.FabricHandle{AllocSize: 64}, TCP: "127.0.0.1:9"}}
	all := []engines.MemoryDesc{local, localNoView, localRDMA, gpuNV, gpuAMD, remote, remoteNoTCP, remoteRDMA, remoteGPU}
	mustClaim := map[[2]engines.MemoryID]string{
		{local.ID, localRDMA.ID}:  engines.EngineXGMI,
		{local.ID, remote.ID}:     engines.EngineTCP,
		{remote.ID, local.ID}:     engines.EngineTCP,
		{localRDMA.ID, remote.ID}: engines.EngineTCP,
	}
	for i := range all {
		for j := range all {
			src, dst := &all[i], &all[j]
			var claimed []string
			for _, e := range c.a.Engines() {
				if ok, _ := e.CanHandle(src, dst); ok {
					claimed = append(claimed, e.Name())
				}
			}
			if len(claimed) > 1 {
				t.Errorf("%s -> %s claimed by %v", src.ID, dst.ID, claimed)
			}
			if want, ok := mustClaim[[2]engines.MemoryID{src.ID, dst.ID}]; ok && !slices.Equal(claimed, []string{want}) {
				t.Errorf("%s -> %s claimed by %v, want %s", src.ID, dst.ID, claimed, want)
			}
		}
	}
}

// claimsAll is a tcp engine posing as rdma that claims every pair, to prove the composite catches overlaps.
type claimsAll struct{ *tcp.Engine }

func (claimsAll) Name() string                                      { return engines.EngineRDMA }
func (claimsAll) CanHandle(_, _ *engines.MemoryDesc) (bool, string) { return true, "" }

func TestCompositeRefusesOverlappingEngines(t *testing.T) {
	x, _ := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	greedy, _ := tcp.New(tcp.Options{Node: "node-a"})
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, claimsAll{greedy}, x)
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	for _, id := range []string{"node-a/1", "node-a/2"} {
		if _, err := comp.Register(context.Background(), hostDesc(id, "node-a", make([]byte, 8))); err != nil {
			t.Fatal(err)
		}
	}
	err = comp.NewPlan().Add(engines.Item{Src: "node-a/1", Dst: "node-a/2", Size: 8, Tag: 5})
	if !errors.Is(err, engines.ErrUnplannable) || !strings.Contains(err.Error(), "both claim the pair") {
		t.Fatalf("overlapping engines: Add = %v, want unplannable naming the conflict", err)
	}
}

func TestExplainAndRouteCache(t *testing.T) {
	c := newCluster(t)
	l1, l2 := c.localRegion(t, make([]byte, 64)), c.localRegion(t, make([]byte, 64))
	r := c.remoteRegion(t, make([]byte, 64))
	ex, err := c.a.Explain(l1.ID, l2.ID)
	if err != nil || ex.Engine != engines.EngineXGMI || len(ex.Refusals) != 0 || ex.Direction != engines.DirLocal {
		t.Fatalf("Explain(local, local) = %+v, %v; want xgmi with no refusals", ex, err)
	}
	ex, err = c.a.Explain(l1.ID, r.ID)
	if err != nil || ex.Engine != engines.EngineTCP || len(ex.Refusals) != 1 || ex.Refusals[0].Engine != engines.EngineXGMI ||
		ex.Direction != engines.DirWrite {
		t.Fatalf("Explain(local, remote) = %+v, %v; want tcp after xgmi's refusal", ex, err)
	}
	// Route the pair once, then replace the remote region under the same id with one tcp cannot reach: the
	// cached route must not survive.
	b := c.a.NewPlan()
	if err := b.Add(engines.Item{Src: l1.ID, Dst: r.ID, Size: 8, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.a.Deregister(context.Background(), r.ID); err != nil {
		t.Fatal(err)
	}
	again := r
	again.Handles.TCP = ""
	if err := c.a.Import(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	err = c.a.NewPlan().Add(engines.Item{Src: l1.ID, Dst: r.ID, Size: 8, Tag: 2})
	var ue *engines.UnplannableError
	if !errors.As(err, &ue) || len(ue.Refusals) != 2 || !strings.Contains(ue.Error(), "no TCP endpoint") {
		t.Fatalf("after re-import without a TCP endpoint: %v; want unplannable with both engines' reasons", err)
	}
	ex, _ = c.a.Explain(l1.ID, r.ID)
	if ex.Engine != "" || len(ex.Refusals) != 2 {
		t.Fatalf("Explain of an unplannable pair = %+v", ex)
	}
}

func TestMixedBatchAndMetrics(t *testing.T) {
	c := newCluster(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.metrics)
	srcBuf, localBuf, remoteBuf := make([]byte, 1<<20), make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range srcBuf {
		srcBuf[i] = byte(i * 7)
	}
	src, local, remote := c.localRegion(t, srcBuf), c.localRegion(t, localBuf), c.remoteRegion(t, remoteBuf)
	b := c.a.NewPlan()
	for i, it := range []engines.Item{
		{Src: src.ID, Dst: local.ID, SrcOffset: 0, DstOffset: 100, Size: 1000},
		{Src: src.ID, Dst: remote.ID, SrcOffset: 5000, DstOffset: 0, Size: 300000},
		{Src: src.ID, Dst: local.ID, SrcOffset: 1 << 20, Size: 1},
	} {
		it.Tag = engines.Tag(i)
		_ = b.Add(it)
	}
	ps := b.Build()
	if len(ps.Plans) != 2 || ps.Plans[0].Engine != engines.EngineXGMI || ps.Plans[1].Engine != engines.EngineTCP {
		t.Fatalf("plans %+v, want one xgmi plan then one tcp plan", ps.Plans)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := c.a.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if string(localBuf[100:1100]) != string(srcBuf[:1000]) || string(remoteBuf[:300000]) != string(srcBuf[5000:305000]) {
		t.Fatal("bytes did not land")
	}
	got := counters(t, reg)
	for key, want := range map[string]float64{
		"ops_total/xgmi/local/ok":         1,
		"bytes_total/xgmi/local/ok":       1000,
		"ops_total/tcp/write/ok":          1,
		"bytes_total/tcp/write/ok":        300000,
		"ops_total/none/local/rejected":   1,
		"bytes_total/none/local/rejected": 1,
		"duration_seconds/xgmi/local/ok":  1,
		"duration_seconds/tcp/write/ok":   1,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v (all: %v)", key, got[key], want, got)
		}
	}
	if got["seconds_total/tcp/write/ok"] <= 0 {
		t.Errorf("no seconds charged to tcp writes: %v", got)
	}
	// Only charged series are exported: no zero series for engines or directions that never ran.
	if len(got) != 10 {
		t.Errorf("%d series, want the 10 charged: %v", len(got), got)
	}
}

// counters flattens the transfer counters to "name/engine/direction/status" -> value.
func counters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range promtest.Samples(t, reg) {
		labels := map[string]string{}
		for _, l := range s.Labels {
			labels[l.Name] = l.Value
		}
		name := strings.TrimPrefix(s.Name, "fabricxfer_transfer_")
		out[name+"/"+labels["engine"]+"/"+labels["direction"]+"/"+labels["status"]] = s.Value
	}
	return out
}

// BenchmarkCompositePlanScattered plans 15,360 blocks of 720 B between two local regions through the composite
// over engines sharing its registry (it checks the batch and builds the engine's plans in one pass): the
// agent's planning path.
func BenchmarkCompositePlanScattered(b *testing.B) { benchmarkCompositePlanScattered(b, true) }

// BenchmarkCompositePlanScatteredSeparate is the same batch through a composite over an engine with a
// registry of its own, to which the composite hands the checked items for planning.
func BenchmarkCompositePlanScatteredSeparate(b *testing.B) { benchmarkCompositePlanScattered(b, false) }

func benchmarkCompositePlanScattered(b *testing.B, shared bool) {
	const n, bs = 15360, 720
	var regions *engines.Registry
	if shared {
		regions = engines.NewRegistry("node-a", 0)
	}
	x, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: regions}, xgmi.NewHostBackend())
	if err != nil {
		b.Fatal(err)
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: regions}, x)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { comp.Close() })
	src, err := comp.Register(context.Background(), hostDesc("node-a/src", "node-a", make([]byte, 2*n*bs)))
	if err != nil {
		b.Fatal(err)
	}
	dst, err := comp.Register(context.Background(), hostDesc("node-a/dst", "node-a", make([]byte, 2*n*bs)))
	if err != nil {
		b.Fatal(err)
	}
	perm := func(seed uint64) []int {
		out := make([]int, 2*n)
		for i := range out {
			out[i] = i
		}
		for i := len(out) - 1; i > 0; i-- { // deterministic shuffle
			seed = seed*6364136223846793005 + 1442695040888963407
			j := int(seed>>33) % (i + 1)
			out[i], out[j] = out[j], out[i]
		}
		return out[:n]
	}
	from, to := perm(1), perm(2)
	items := make([]engines.Item, n)
	for i := range items {
		items[i] = engines.Item{Src: src.ID, Dst: dst.ID, SrcOffset: uint64(from[i]) * bs, DstOffset: uint64(to[i]) * bs, Size: bs, Tag: engines.Tag(i)}
	}
	for b.Loop() {
		p := comp.NewPlan()
		for _, it := range items {
			if err := p.Add(it); err != nil {
				b.Fatal(err)
			}
		}
		if ps := p.Build(); len(ps.Plans) != 1 || len(ps.Plans[0].Segments) != n {
			b.Fatalf("%d plans", len(ps.Plans))
		}
	}
}

// Plans come out in the order their pairs were first added, whatever the destinations' order; within a plan,
// segments and tags follow the destination.
func TestCompositePlanOrderFollowsTheItems(t *testing.T) {
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x)
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	reg := func(id string) engines.MemoryID {
		d, err := comp.Register(context.Background(), hostDesc(id, "node-a", make([]byte, 1<<16)))
		if err != nil {
			t.Fatal(err)
		}
		return d.ID
	}
	s, dx, dy := reg("node-a/s"), reg("node-a/x"), reg("node-a/y") // x sorts before y
	p := comp.NewPlan()
	for i, it := range []engines.Item{
		{Src: s, Dst: dy, SrcOffset: 0, DstOffset: 4096, Size: 100},
		{Src: s, Dst: dx, SrcOffset: 100, DstOffset: 0, Size: 100},
		{Src: s, Dst: dy, SrcOffset: 200, DstOffset: 0, Size: 100},
	} {
		it.Tag = engines.Tag(i)
		if err := p.Add(it); err != nil {
			t.Fatal(err)
		}
	}
	ps := p.Build()
	if len(ps.Plans) != 2 || ps.Plans[0].Dst != dy || ps.Plans[1].Dst != dx {
		t.Fatalf("plans %v, want the pair added first (to y) first", ps.Plans)
	}
	if got := ps.Plans[0].Tags; len(got) != 2 || got[0] != 2 || got[1] != 0 {
		t.Errorf("tags of the plan to y = %v, want [2 0] (destination order)", got)
	}
}

// TestRouteCacheIsKeyedByBothMemories: two regions of one remote node route differently when only one of them is
// reachable by tcp; a cache keyed by the nodes (or by one side) would hand the second the first one's engine.
func TestRouteCacheIsKeyedByBothMemories(t *testing.T) {
	c := newCluster(t)
	l := c.localRegion(t, make([]byte, 64))
	reachable := c.remoteRegion(t, make([]byte, 64))
	unreachable := c.remoteRegion(t, make([]byte, 64))
	if err := c.a.Deregister(context.Background(), unreachable.ID); err != nil {
		t.Fatal(err)
	}
	unreachable.Handles.TCP = ""
	if err := c.a.Import(context.Background(), unreachable); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{engines.EngineTCP, ""} {
		dst := []engines.MemoryID{reachable.ID, unreachable.ID}[i]
		err := c.a.NewPlan().Add(engines.Item{Src: l.ID, Dst: dst, Size: 8})
		switch {
		case want != "" && err != nil:
			t.Fatalf("%s: %v", dst, err)
		case want == "" && !errors.Is(err, engines.ErrUnplannable):
			t.Fatalf("%s has no tcp endpoint but was planned (%v): the route of another region of its node was reused", dst, err)
		}
		ex, _ := c.a.Explain(l.ID, dst)
		if ex.Engine != want {
			t.Fatalf("Explain(%s) = %q, want %q", dst, ex.Engine, want)
		}
	}
	// The same two regions in the other direction, with the source side varying.
	if err := c.a.NewPlan().Add(engines.Item{Src: unreachable.ID, Dst: l.ID, Size: 8}); !errors.Is(err, engines.ErrUnplannable) {
		t.Fatalf("reading from the region without a tcp endpoint: %v", err)
	}
	if err := c.a.NewPlan().Add(engines.Item{Src: reachable.ID, Dst: l.ID, Size: 8}); err != nil {
		t.Fatalf("reading from the reachable region: %v", err)
	}
}
