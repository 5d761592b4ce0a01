// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package promtest reads a Prometheus registry the way tests compare it: every series with its name, labels and
// value (Samples), or keyed by name and labels (Gather). The agent's, the engines' and the operator's tests share it.
package promtest
