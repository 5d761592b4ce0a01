// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package gpushare holds what the CUDA and HIP backends of the xgmi engine do alike whatever the runtime:
// finding a GPU's ordinal from the agent's location, judging whether a backend can move a pair, polling a
// completion event, and writing compiled kernels to the on-disk cache.
package gpushare
