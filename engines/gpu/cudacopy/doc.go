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
package cudacopy
