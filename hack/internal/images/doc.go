// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package images builds the operator's and the agent's OCI images without a container engine, with
// go-containerregistry: the binaries are cross-compiled with go build, and the base is assembled from files the
// build machine already has (an /etc with root and nonroot users; for the cgo agent, Debian's glibc: the host's
// for amd64, the cross toolchain's for arm64). Timestamps are fixed, so a build is reproducible.
package images
