// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"fmt"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// CUDADMABuf exports NVIDIA GPU memory as dma-buf for registration.
type CUDADMABuf struct {
	Driver *cuda.Driver
	// PageSize is the host page size the export is aligned to (default 4096).
	PageSize uint64
}

// DMABuf implements DMABufExporter: the range is widened to whole pages, as
// the driver requires, and the offset of addr inside it returned.
func (c CUDADMABuf) DMABuf(gpu int, addr, length uint64) (int, uint64, error) {
	page := c.PageSize
	if page == 0 {
		page = 4096
	}
	start := addr &^ (page - 1)
	end := (addr + length + page - 1) &^ (page - 1)
	dev, err := c.Driver.DeviceGet(gpu)
	if err != nil {
		return -1, 0, err
	}
	ctx, err := c.Driver.PrimaryContextRetain(dev)
	if err != nil {
		return -1, 0, err
	}
	defer c.Driver.PrimaryContextRelease(dev)
	fd := -1
	err = c.Driver.WithContext(ctx, func() (err error) {
		fd, err = c.Driver.DMABufFD(cuda.DevicePtr(start), end-start)
		return err
	})
	if err != nil {
		return -1, 0, fmt.Errorf("exporting GPU %d memory [%#x, +%d) as dma-buf: %w", gpu, start, end-start, err)
	}
	return fd, addr - start, nil
}
