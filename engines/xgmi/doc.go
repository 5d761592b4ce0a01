// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package xgmi is the same-node engine: it copies between two regions that both belong to this node. GPU
// pairs go over XGMI (AMD) or NVLink peer access (NVIDIA), host pairs are plain memory copies; the CRD keeps
// the four engine names users know, so the CPU twin lives in this slot too.
//
// The engine owns registration, planning, deadlines, cancellation and notifications; the copies themselves
// are done by backends ([Backend]), each claiming the pairs it can move by location. This package ships the
// host backend ([HostBackend]); GPU backends live with the GPU runtime bindings and are passed to [New]:
//
//	eng, err := xgmi.New(xgmi.Options{Node: node}, cudaBackend, xgmi.NewHostBackend())
//
// Backends must be disjoint (no pair claimed by two); the engine checks it in Options.CheckDisjoint mode.
package xgmi
