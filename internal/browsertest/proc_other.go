//go:build !unix

package browsertest

import (
	"os"
	"syscall"
	"time"
)

// supported is false: Chromium's debugging pipe is file descriptors 3
// and 4, which os/exec cannot hand a child here.
const supported = false

func sysProcAttr() *syscall.SysProcAttr                        { return nil }
func killGroup(p *os.Process) error                            { return p.Kill() }
func endAll(pgid int, dir string, timeout time.Duration) error { return nil }
