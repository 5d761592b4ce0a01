// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package gpubench measures the GPU copy paths side by side in one process:
// the raw copy engine, the copy kernels, the driver's per-item and batch
// copies, and the xgmi engine end to end over its CUDA backend, so ratios
// come from the same run on the same card.
package gpubench
