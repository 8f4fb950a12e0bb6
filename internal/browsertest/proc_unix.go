//go:build unix

package browsertest

import (
	"os"
	"syscall"
)

const supported = true

// killGroup sends SIGKILL to the process group of p, which was started
// with Setpgid, so its pgid is its pid.
func killGroup(p *os.Process) error {
	err := syscall.Kill(-p.Pid, syscall.SIGKILL)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}
