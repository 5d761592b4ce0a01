// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package kernels embeds the GPU copy kernels' sources (copy.cu for CUDA,
// copy.hip for HIP) so the agent can compile them at start, with NVRTC or
// hipRTC, for whatever GPU it finds. The Go side that launches them lives in
// engines/gpu/cudacopy; the descriptor layouts there mirror the structs here.
package kernels
