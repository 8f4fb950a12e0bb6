package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// cpuClock is the CPU time the calling thread has used
// (CLOCK_THREAD_CPUTIME_ID): timeOp locks its goroutine to its thread, so
// that what it times is the CPU the codec used, not the time other
// processes of a busy machine took it. Where the kernel refuses that clock
// it is the wall clock.
var cpuClock = func() func() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return wallClock
	}
	return func() time.Duration {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano())
	}
}()
