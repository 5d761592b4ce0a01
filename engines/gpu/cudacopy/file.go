// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import "os"

// newFile wraps an fd the driver exported (close-on-exec) so it is closed with
// the descriptor that carries it.
func newFile(fd int, name string) *os.File {
	return os.NewFile(uintptr(fd), "vmm:"+name)
}
