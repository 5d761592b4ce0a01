// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

//go:build !linux

package sockio

// OfferCore does nothing where sched_yield is not at hand: pollers spin as before.
func OfferCore() {}
