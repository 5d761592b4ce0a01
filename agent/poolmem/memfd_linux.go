package poolmem

import "golang.org/x/sys/unix"

func memfdCreate(name string) (int, error) {
	return unix.MemfdCreate(name, unix.MFD_CLOEXEC)
}
