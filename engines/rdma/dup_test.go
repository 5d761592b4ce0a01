// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma_test

import (
	"os"
	"syscall"
)

func dupAndClose(f *os.File, fd int) (int, error) {
	nfd, err := syscall.Dup(fd)
	f.Close()
	return nfd, err
}
