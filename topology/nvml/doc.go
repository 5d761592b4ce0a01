// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package nvml implements topology.NVML with NVIDIA's management library through github.com/NVIDIA/go-nvml.
// go-nvml is cgo and loads libnvidia-ml.so.1 at Open, so a binary built with cgo still runs on nodes without
// NVIDIA drivers (Open then fails with a clear error). Built without cgo, Open always reports that NVML is
// unavailable, so the rest of the project builds with CGO_ENABLED=0.
package nvml
