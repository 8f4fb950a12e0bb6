//go:build !unix

package redistest

import (
	"errors"
	"os"
	"syscall"
)

const canPause = false

var errNoPause = errors.New("pausing a process is not supported on this platform")

func sysProcAttr() *syscall.SysProcAttr { return nil }

func terminate(p *os.Process) error { return p.Kill() }
func forceKill(p *os.Process) error { return p.Kill() }
func suspend(p *os.Process) error   { return errNoPause }
func resume(p *os.Process) error    { return errNoPause }
