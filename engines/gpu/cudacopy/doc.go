// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package cudacopy moves bytes between GPU memory (and pinned or registered
// host memory) on one node with the CUDA driver: scattered items go out as
// one descriptor-driven kernel launch (native/kernels), large contiguous
// items go to the copy engine, and without a compiled kernel the driver's
// batch copy (or one copy per item) does the work and Copier.Mode says so.
//
// It is the CUDA backend of the xgmi engine; the engine plans, this package
// executes plans on a device's stream and reports completion through events.
// The bookkeeping it shares with the HIP backend (engines/gpu/hipcopy) lives in
// engines/gpu/internal/gpushare and engines/gpu/internal/scatter; what is
// CUDA's alone stays here: the copy path (Copier.Submit*, Pending.Wait), block
// lists checked on the GPU, pinned id buffers, kept descriptor sets, timing
// gates, batch copies and the tcp engine's stager.
package cudacopy
