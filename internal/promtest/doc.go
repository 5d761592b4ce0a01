// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package promtest reads a Prometheus registry the way tests compare it: every sample by its name and labels.
package promtest
