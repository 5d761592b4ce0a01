// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package nvmlfake answers topology.NVML queries from a JSON description of a machine's GPUs, so fixture
// nodes (and demos on machines without NVIDIA GPUs) can stand in for NVML at the hardware edge.
package nvmlfake
