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
