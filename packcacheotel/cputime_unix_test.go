//go:build unix

package packcacheotel_test

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time this process has used, user and system: the
// cost of a Get to the client, without the waits of the round trip that
// make wall time noisy on a busy machine.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
