// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package cuda binds the subset of the CUDA driver API and NVRTC that the GPU
// engines need. The libraries are opened at run time with dlopen (through
// purego), so binaries build with CGO_ENABLED=0 and run on CPU-only nodes,
// where Load returns an error that says why the driver is unavailable.
//
// The bindings are thin: every call returns a *Error carrying the CUDA result
// code and its name, and nothing here keeps package-level state. The CUDA
// current context is per OS thread, so callers that touch it lock their
// goroutine to its thread (see Driver.WithContext).
package cuda
