//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group so the whole group
// can be signalled.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
