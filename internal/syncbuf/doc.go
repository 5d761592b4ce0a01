// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package syncbuf is a byte buffer safe for concurrent writers and readers: tests collect a component's log
// output, written from its goroutines, and read it while it runs.
package syncbuf
