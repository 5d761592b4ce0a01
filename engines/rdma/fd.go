// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import "syscall"

// closeFD closes a dma-buf fd once the NIC holds its own reference.
func closeFD(fd int) { _ = syscall.Close(fd) }
