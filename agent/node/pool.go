// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/engines"
)

// newPool creates the memory the agent lends: device memory on every NVIDIA GPU when the pool asks for it and
// the driver loaded, else host shared memory when the pool asks for that; nil when it asks for neither.
func newPool(cfg Config, gpus []server.GPUInfo, driver poolmem.GPUDriver, log *slog.Logger) (poolmem.Allocator, error) {
	if cfg.PoolGPUBytes > 0 {
		var targets []poolmem.GPUTarget
		for _, g := range gpus {
			if g.Vendor == engines.VendorNVIDIA {
				targets = append(targets, poolmem.GPUTarget{Index: g.Index, BusID: g.BusID})
			}
		}
		switch {
		case len(targets) == 0:
			log.Info("no GPU pool memory: this node has no NVIDIA GPUs", "poolGPUBytes", cfg.PoolGPUBytes)
		case driver == nil:
			log.Info("no GPU pool memory: the CUDA driver did not load", "poolGPUBytes", cfg.PoolGPUBytes)
		default:
			gp, err := poolmem.NewGPUWithOptions(driver, targets, poolmem.GPUOptions{PerGPU: cfg.PoolGPUBytes, SlabBytes: cfg.PoolSlabBytes})
			if err != nil {
				return nil, fmt.Errorf("allocating the pool's GPU memory (--pool-gpu-bytes): %w", err)
			}
			for _, d := range gp.Devices() {
				log.Info("GPU pool memory allocated", "gpu", d.Index, "busID", d.BusID, "bytes", d.Total,
					"fabricExportable", d.FabricExportable, "notExportableBecause", d.FabricReason)
			}
			if cfg.PoolHostBytes > 0 {
				log.Info("host pool memory not allocated: this node lends GPU memory", "poolHostBytes", cfg.PoolHostBytes)
			}
			return gp, nil
		}
	}
	if cfg.PoolHostBytes > 0 {
		return poolmem.NewHost("fabricxfer-"+cfg.PoolName, cfg.PoolHostBytes)
	}
	return nil, nil
}

// fastSpin maps the flag's 0 ("never poll") to the server's negative value (its 0 means the default).
func fastSpin(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func hostRoot(r string) string {
	if r == "" {
		return "/"
	}
	return r
}
