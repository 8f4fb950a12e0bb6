//go:build linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group (so the whole group
// can be signalled and nothing is orphaned) and asks the kernel to SIGKILL it
// if the test binary dies without running its cleanups (e.g. a test timeout
// panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
