// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hipcopy"
	"github.com/fabricxfer/fabricxfer/topology"
)

// loadGPURuntimes loads the GPU runtimes the node's GPUs need and builds the same-node engine's GPU backends:
// HIP for AMD GPUs, CUDA for NVIDIA GPUs (whose backend the tcp engine also stages through). A node whose GPU
// runtime does not load keeps the host backends and says why. It returns what to close once the engines that
// use the runtimes are closed.
func (t *transferSide) loadGPURuntimes() (closers []func() error) {
	if slices.ContainsFunc(t.report.GPUs, func(g topology.GPU) bool { return g.Vendor == topology.VendorAMD }) {
		if be := t.hipBackend(); be != nil {
			t.hipCopiers.Store(be)
			t.xgmiBackends = append(t.xgmiBackends, be)
			closers = append(closers, be.Close)
		}
	}
	if be := t.cudaBackend(); be != nil {
		t.cudaCopiers.Store(be)
		t.xgmiBackends = append(t.xgmiBackends, be)
		closers = append(closers, be.Close)
	}
	return closers
}

// hipBackend loads the HIP runtime and hipRTC and builds the AMD GPU backend, or logs and records why not. The
// kernels are compiled for each GPU's gfx target as KFD reports it (the topology's model).
func (t *transferSide) hipBackend() *hipcopy.Backend {
	var paths []string
	if t.opts.Libamdhip64 != "" {
		paths = []string{t.opts.Libamdhip64}
	}
	rt, err := hip.Load(paths...)
	if err != nil {
		t.gpuCopyWhyNot = err.Error()
		t.log.Info("AMD GPU copy backend unavailable: same-node copies use the host backend only", "reason", err.Error())
		return nil
	}
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.log.Info("hipRTC unavailable: AMD GPU copies use one hipMemcpyAsync per item", "reason", err.Error())
		rtc = nil
	}
	archs := map[string]string{}
	for _, g := range t.report.GPUs {
		if g.Vendor == topology.VendorAMD && g.Model != "" && g.PCIBusID != "" {
			archs[strings.ToLower(g.PCIBusID)] = g.Model
		}
	}
	be, err := hipcopy.NewBackend(rt, hipcopy.Options{RTC: rtc, CacheDir: t.opts.KernelCache, Archs: archs})
	if err != nil {
		t.gpuCopyWhyNot = "HIP copy backend: " + err.Error()
		t.log.Info("AMD GPU copy backend unavailable: same-node copies use the host backend only", "reason", t.gpuCopyWhyNot)
		return nil
	}
	t.log.Info("AMD GPU copy backend running", "hip", rt.Path(), "hipRTC", rtc != nil)
	return be
}

// cudaBackend loads the CUDA driver when the node has NVIDIA GPUs and builds the GPU backend of the same-node
// engine, which the tcp engine stages GPU memory through. A node without the driver keeps the host engines and
// says why.
func (t *transferSide) cudaBackend() *cudacopy.Backend {
	if !slices.ContainsFunc(t.report.GPUs, func(g topology.GPU) bool { return g.Vendor == "nvidia" }) {
		t.tcpNoStageReason = "no GPU on this node"
		if len(t.report.GPUs) > 0 {
			t.tcpNoStageReason = "AMD GPU memory has no HIP staging"
		}
		return nil
	}
	drv, err := cuda.Load()
	if err != nil {
		t.log.Info("GPU engines unavailable: CUDA driver did not load", "reason", err.Error())
		t.tcpNoStageReason = "the CUDA driver did not load: " + err.Error()
		t.noGPUCopy(t.tcpNoStageReason)
		return nil
	}
	t.cudaDriver = drv
	nvrtc, err := cuda.LoadNVRTC()
	if err != nil {
		t.log.Info("NVRTC unavailable: copies use driver batch copies", "reason", err.Error())
		nvrtc = nil
	}
	t.cudaCopy = cudacopy.Options{NVRTC: nvrtc, CacheDir: t.opts.KernelCache, FeatureOff: logFeatureOff(t.log)}
	be, err := cudacopy.NewBackend(drv, t.cudaCopy)
	if err != nil {
		t.log.Info("GPU copy backend unavailable", "reason", err.Error())
		t.tcpNoStageReason = "the CUDA copy backend did not start: " + err.Error()
		t.noGPUCopy(t.tcpNoStageReason)
		return nil
	}
	// The tcp engine stages GPU memory through the same backend: the same-node engine maps every region
	// first, and the stager holds the mapping while the tcp engine uses it.
	t.tcpStager = be.Stager()
	t.cudaCopyRunning = true
	t.gpuSharing = gpuSharing(drv.DeviceCount, func(ordinal int) (int, error) {
		dev, err := drv.DeviceGet(ordinal)
		if err != nil {
			return 0, err
		}
		return drv.DeviceAttribute(dev, cuda.AttrMPSEnabled)
	})
	t.log.Info("NVIDIA GPU sharing", "sharing", t.gpuSharing)
	return be
}

// gpuSharing says how the agent's GPU work shares the NVIDIA GPUs with the other processes on them, from the
// driver's count of GPUs and each one's CU_DEVICE_ATTRIBUTE_MPS_ENABLED. It matters more than any copy path:
// without MPS a GPU runs one process's work at a time, so while an inference engine computes on it every copy
// of the agent waits for that engine's timeslice (about 2.4 ms each on an H200, DESIGN.md); through MPS the
// copies run beside its kernels.
func gpuSharing(count func() (int, error), mps func(ordinal int) (int, error)) string {
	n, err := count()
	if err != nil {
		return "GPU sharing unknown: counting GPUs: " + err.Error()
	}
	var shared []string
	for i := range n {
		on, err := mps(i)
		if err != nil {
			return fmt.Sprintf("GPU sharing unknown: reading whether GPU %d runs under MPS: %s", i, err)
		}
		if on != 0 {
			shared = append(shared, strconv.Itoa(i))
		}
	}
	const timeSliced = "time-sliced with other processes (no MPS): while another process computes on a GPU, each copy waits for its timeslice"
	switch {
	case n == 0:
		return "no NVIDIA GPU visible to the CUDA driver"
	case len(shared) == n:
		return "GPU work shared through MPS: copies run beside other processes' kernels"
	case len(shared) == 0:
		return "GPUs " + timeSliced
	default:
		return fmt.Sprintf("GPU work shared through MPS on CUDA GPUs %s of %d; the others %s", strings.Join(shared, ","), n, timeSliced)
	}
}

// fabricEngine builds the fabric engine on the CUDA runtime when the copy backend runs and the pool allows
// fabric, with notifier carrying its notifications to peers and reg the node's region table. It returns the
// engine (nil when it does not run) and what closes its runtime once the engine is closed.
func (t *transferSide) fabricEngine(node string, reg *engines.Registry, notifier engines.NotifySender) (*fabric.Engine, func() error) {
	if !t.cudaCopyRunning || !engineAllowed(t.report, engines.EngineFabric) {
		return nil, nil
	}
	rt := fabric.NewCUDARuntime(t.cudaDriver, t.cudaCopy)
	fe, err := fabric.New(fabric.Options{Node: node, Runtime: rt, Notifier: notifier, Registry: reg})
	if err != nil {
		t.log.Info("fabric engine unavailable", "reason", err.Error())
		_ = rt.Close()
		return nil, nil
	}
	t.fabric.Store(fe)
	return fe, rt.Close
}

// driverOrNil is the loaded CUDA driver as pool memory takes it: a nil interface when none loaded.
func driverOrNil(drv *cuda.Driver) poolmem.GPUDriver {
	if drv == nil {
		return nil
	}
	return drv
}

// noGPUCopy records why the same-node engine copies no GPU memory on a node with GPUs (the first reason, when
// both runtimes fail), for GetInfo and the report.
func (t *transferSide) noGPUCopy(why string) {
	if t.gpuCopyWhyNot == "" {
		t.gpuCopyWhyNot = why
	}
}
