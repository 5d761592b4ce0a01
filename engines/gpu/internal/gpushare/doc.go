// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package gpushare holds what the CUDA and HIP backends of the xgmi engine do alike whatever the runtime:
// the Registry of a backend (a copier per GPU, the regions it mapped and how, the pair rule, peer access asked
// once per pair, handles the tcp engine holds on a region, release and close), mapping by handle kind and the
// legacy IPC mapping, waiting out a cancelled copy, finding a GPU's ordinal from the agent's location, polling
// a completion event, pooling events and descriptor staging, a copy's end (Completion), looking up the copy kernels, keeping resident descriptor sets, and writing
// compiled kernels to the on-disk cache. What differs between the runtimes (context or device selection,
// peer enabling, setting up a copier) reaches it through the small Runtime interface; the copy path itself
// (Copier.Submit, Pending.Wait) stays in each backend, on concrete types.
package gpushare
