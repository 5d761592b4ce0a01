// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package dynlib is what the CUDA and HIP bindings share to reach a C library opened at run time: opening the
// first library of a list that loads, resolving entry points by name, and reading C strings and C memory.
// The calls themselves and the C structs stay in each binding: each mirrors its own vendor's headers.
package dynlib
