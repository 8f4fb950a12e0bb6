//go:build linux

package browsertest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr puts the browser in a process group of its own (so the
// group can be killed and nothing is orphaned) and asks the kernel to
// SIGKILL it if the test binary dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// endAll kills, and waits for the end of, every live process of group pgid
// and every one whose command line names dir: chrome_crashpad_handler
// leaves the group for a session of its own, but its database is under
// dir. It fails after timeout. A zombie counts as ended: orphans are
// reaped by whichever process adopts them, which may never do it.
func endAll(pgid int, dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := leftovers(pgid, []byte(dir))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("browsertest: the browser's processes %v still alive after SIGKILL", pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		// SIGKILL takes effect asynchronously; there is nothing to
		// wait on for a process that is not our child.
		time.Sleep(10 * time.Millisecond)
	}
}

// leftovers lists the live processes of group pgid or naming dir in
// their command line.
func leftovers(pgid int, dir []byte) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, path := range stats {
		stat, err := os.ReadFile(path)
		if err != nil {
			continue // ended since the glob
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and
		// parentheses, so the fields start after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 3 || string(f[0]) == "Z" || string(f[0]) == "X" {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if g, _ := strconv.Atoi(string(f[2])); g == pgid {
			pids = append(pids, pid)
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "cmdline"))
		if bytes.Contains(cmdline, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}
