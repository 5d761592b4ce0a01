// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hipcopy"
)

// gpuCopier is one GPU's copier as the agent's metrics read it.
type gpuCopier struct {
	mode string
	// off lists the features not in use (cudacopy.Feature values).
	off                []string
	replayed, captured uint64
}

// gpuCopierModes and gpuCopierFeatures are every value the copiers' gauges are exported under (0 where no copier
// has it), so a dashboard sees a copier leave a mode rather than its series vanish.
var (
	gpuCopierModes    = []string{string(cudacopy.ModeKernel), string(cudacopy.ModeBatch), string(cudacopy.ModePerItem), string(hipcopy.ModePerItem)}
	gpuCopierFeatures = []string{string(cudacopy.FeatureKernels), string(cudacopy.FeatureDoneWord), string(cudacopy.FeatureCopyReplay)}
)

// gpuCopiersOf reads the copiers of whichever GPU backends run (nil: not yet, or none).
func gpuCopiersOf(cuda *cudacopy.Backend, hip *hipcopy.Backend) []gpuCopier {
	var out []gpuCopier
	if cuda != nil {
		for _, st := range cuda.States() {
			c := gpuCopier{mode: string(st.Mode), replayed: st.Replayed, captured: st.Captured}
			for _, f := range gpuCopierFeatures {
				if _, off := st.Off[cudacopy.Feature(f)]; off {
					c.off = append(c.off, f)
				}
			}
			out = append(out, c)
		}
	}
	if hip != nil {
		for _, m := range hip.Modes() {
			// HIP copiers have the kernels or not; waiters ask the runtime and nothing is replayed.
			c := gpuCopier{mode: string(m), off: []string{string(cudacopy.FeatureDoneWord), string(cudacopy.FeatureCopyReplay)}}
			if m != hipcopy.ModeKernel {
				c.off = append(c.off, string(cudacopy.FeatureKernels))
			}
			out = append(out, c)
		}
	}
	return out
}

// gpuCopierCollector exports what the GPU copiers run with, read at scrape time: copiers by mode, copiers
// without each fast-path feature, and the copy-engine copies launched from kept graphs and the graphs captured.
type gpuCopierCollector struct {
	read                                   func() []gpuCopier
	copiers, featureOff, replays, captures *prometheus.Desc
}

func newGPUCopierCollector(read func() []gpuCopier) *gpuCopierCollector {
	name := func(n string) string { return prometheus.BuildFQName("fabricxfer", "agent", n) }
	return &gpuCopierCollector{read: read,
		copiers: prometheus.NewDesc(name("gpu_copiers"),
			"GPUs whose copier is set up (at their first registration), by how scattered items move.", []string{"mode"}, nil),
		featureOff: prometheus.NewDesc(name("gpu_copiers_feature_off"),
			"GPU copiers copying without a fast-path feature: kernels (driver copies instead), done_word (waiters ask the driver), copy_replay (every large copy a cuMemcpyAsync); the agent's log says why.",
			[]string{"feature"}, nil),
		replays: prometheus.NewDesc(name("gpu_copy_replays_total"),
			"Copy-engine copies launched from a kept graph (a range copied again).", nil, nil),
		captures: prometheus.NewDesc(name("gpu_copy_captures_total"),
			"Copy-engine ranges captured as graphs for replay.", nil, nil),
	}
}

func (c *gpuCopierCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.copiers
	ch <- c.featureOff
	ch <- c.replays
	ch <- c.captures
}

func (c *gpuCopierCollector) Collect(ch chan<- prometheus.Metric) {
	modes, off := map[string]int{}, map[string]int{}
	var replays, captures uint64
	for _, g := range c.read() {
		modes[g.mode]++
		for _, f := range g.off {
			off[f]++
		}
		replays += g.replayed
		captures += g.captured
	}
	for _, m := range gpuCopierModes {
		ch <- prometheus.MustNewConstMetric(c.copiers, prometheus.GaugeValue, float64(modes[m]), m)
	}
	for _, f := range gpuCopierFeatures {
		ch <- prometheus.MustNewConstMetric(c.featureOff, prometheus.GaugeValue, float64(off[f]), f)
	}
	ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(replays))
	ch <- prometheus.MustNewConstMetric(c.captures, prometheus.CounterValue, float64(captures))
}

// logFeatureOff is the CUDA copiers' FeatureOff: a copier that starts without a fast-path feature, or loses one,
// says so once in the agent's log, where an admin who sees the gauge looks for why.
func logFeatureOff(log *slog.Logger) func(ordinal int, f cudacopy.Feature, why string) {
	return func(ordinal int, f cudacopy.Feature, why string) {
		log.Warn("GPU copier runs without a fast-path feature", "gpu", ordinal, "feature", string(f), "reason", why)
	}
}
