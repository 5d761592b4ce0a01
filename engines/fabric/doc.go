// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fabric is the scale-up fabric engine: GPU memory on another node of
// the same vPOD (an NVLink domain of NVIDIA IMEX, an AMD UALink vPOD) is
// mapped into this node's GPU address space through a 64-byte fabric handle
// and copied with the GPU's own loads and stores, no NIC involved.
//
// Local GPU memory is exported at registration (the handle names the whole
// allocation; the region's offset and size travel beside it); remote memory
// is imported and mapped on first use, cached, and unmapped when it is
// deregistered. Memory that was not allocated fabric-exportable is refused
// with that reason, so Explain shows why a pair went to RDMA instead.
//
// The hardware is behind [Runtime]; [NewCUDARuntime] is the NVIDIA one.
package fabric
