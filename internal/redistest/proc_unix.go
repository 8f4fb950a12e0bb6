//go:build unix

package redistest

import (
	"os"
	"syscall"
)

const canPause = true

func signalGroup(p *os.Process, sig syscall.Signal) error {
	// The child was started with Setpgid, so its pgid is its pid.
	err := syscall.Kill(-p.Pid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

func terminate(p *os.Process) error { return signalGroup(p, syscall.SIGTERM) }
func forceKill(p *os.Process) error { return signalGroup(p, syscall.SIGKILL) }
func suspend(p *os.Process) error   { return signalGroup(p, syscall.SIGSTOP) }
func resume(p *os.Process) error    { return signalGroup(p, syscall.SIGCONT) }
