// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package coretest measures, for tests, whether a loop that polls for the other side of a call leaves its CPU to
// another thread that needs it: on a host whose cores are all busy, that thread may be the other side's own.
package coretest
