// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package hipcopy moves bytes between AMD GPU memory (and host memory) on one
// node with the HIP runtime: scattered items go out as one descriptor-driven
// kernel launch (native/kernels/copy.hip, compiled by hipRTC for the GPU's
// gfx target), large contiguous items go to the copy engines through
// hipMemcpyAsync, and without hipRTC every item is its own hipMemcpyAsync and
// Copier.Reason says why.
//
// It is the AMD backend of the xgmi engine, the counterpart of
// engines/gpu/cudacopy. What does not depend on the runtime is shared: the
// descriptor layout, kernel choice and launch arguments
// (engines/gpu/internal/scatter), and the backend's bookkeeping (copiers,
// mapped regions, peer pairs, event pools, a copy's end, the kernel cache:
// engines/gpu/internal/gpushare). What stays here is HIP's: the runtime calls,
// its options and modes, and the copy path itself. HIP's current device is
// per OS thread, so every call that needs one runs under
// hip.Runtime.WithDevice, which restores the caller's device.
package hipcopy
