// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import "syscall"

// OfferCore offers this thread's core to any other thread the kernel has waiting for it (sched_yield), and returns
// at once when there is none. A raw system call: the goroutine keeps its thread and its processor, as it does
// while spinning (a yield to the Go scheduler would wake idle processors to take it).
func OfferCore() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}
