// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma_test

import "os"

// pipeFD returns a real fd for the fake dma-buf exporter (the engine closes it).
func pipeFD() (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	w.Close()
	fd := int(r.Fd())
	// Detach the fd from the *os.File so the engine's close is the only one.
	return dupAndClose(r, fd)
}
