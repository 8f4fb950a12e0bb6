//go:build unix && !linux

package browsertest

import (
	"syscall"
	"time"
)

// sysProcAttr puts the browser in a process group of its own so the group
// can be killed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// endAll has no portable way to list processes, so it trusts the SIGKILL
// of the group.
func endAll(pgid int, dir string, timeout time.Duration) error { return nil }
