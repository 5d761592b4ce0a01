// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package scatter is the descriptor layout the GPU copy kernels of
// native/kernels read: how a list of copies is cut into pieces, which
// descriptor form describes them (24-byte general or 8-byte uniform
// offsets), and how the host writes them. The CUDA (engines/gpu/cudacopy) and HIP
// (engines/gpu/hipcopy) backends share it, because copy.cu and copy.hip read the
// same structs and must be fed identically.
package scatter
