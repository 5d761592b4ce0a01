// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package hip binds the subset of the HIP runtime and hipRTC that the AMD GPU
// engines need. The libraries (libamdhip64, libhiprtc) are opened at run time
// with dlopen (through purego), so binaries build with CGO_ENABLED=0 and run
// on nodes without ROCm, where Load and LoadRTC return an error that says why
// HIP is unavailable.
//
// The bindings are thin: every call returns a *Error carrying the hipError_t
// code and its name, and nothing here keeps package-level state. HIP has no
// explicit contexts in everyday use: the current device is per OS thread
// (hipSetDevice), so callers that change it lock their goroutine to its thread
// and restore the previous device (see Runtime.WithDevice).
//
// ABI facts (enum values, struct layouts, by-value handle passing) follow the
// ROCm headers include/hip/hip_runtime_api.h and include/hip/hiprtc.h of
// ROCm/HIP (ROCm 5.x-7.x keep them stable); each is cited where it is used,
// and the struct layouts are checked at compile time and in the tests.
package hip
