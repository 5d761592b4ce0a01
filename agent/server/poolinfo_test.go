// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
)

// reportingPool is a host pool that also reports per-GPU devices, as the GPU pool does, so GetInfo's per-GPU
// fabric status can be checked without a GPU.
type reportingPool struct {
	*poolmem.HostPool
	devices []poolmem.DeviceUsage
}

func (p reportingPool) Devices() []poolmem.DeviceUsage { return p.devices }

func TestGetInfoShowsWhetherPoolMemoryIsFabricExportable(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Pool = reportingPool{HostPool: newHostPool(t, 1<<20), devices: []poolmem.DeviceUsage{
		{Index: 0, BusID: "0000:1b:00.0", Total: 1 << 30, Free: 1 << 29, FabricExportable: true},
		{Index: 1, BusID: "0000:43:00.0", Total: 1 << 30, Free: 1 << 30, FabricReason: "cuMemCreate: CUDA_ERROR_NOT_PERMITTED (an IMEX channel is needed)"},
	}}
	a := startAgent(t, opts)
	c := dial(t, a)
	pm := c.Info().PoolMemory
	if pm == nil || len(pm.Gpus) != 2 {
		t.Fatalf("pool memory info %v, want two GPUs", pm)
	}
	if g := pm.Gpus[0]; !g.FabricExportable || g.BusId != "0000:1b:00.0" || g.FreeBytes != 1<<29 || g.TotalBytes != 1<<30 {
		t.Errorf("GPU 0: %v", g)
	}
	if g := pm.Gpus[1]; g.FabricExportable || g.FabricReason == "" || g.Index != 1 {
		t.Errorf("GPU 1: %v, want not exportable with the reason", g)
	}
}
