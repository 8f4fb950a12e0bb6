package redistest

import (
	"os/exec"
	"runtime"
	"testing"
)

// Saturate keeps every core of the machine busy for the rest of the test:
// it starts perCore busy-looping processes per core (runtime.NumCPU), each
// a shell spinning on its builtin ':', and stops them, by their process
// ids, when the test ends. Tests of what the cache does when its own
// process cannot get a CPU in time use it: the goroutines of a surge then
// wait for a core behind the busy processes as well as behind each other.
// With perCore 4 the test's process gets about a fifth of the machine.
func Saturate(tb testing.TB, perCore int) {
	tb.Helper()
	for range perCore * runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			tb.Fatalf("redistest: Saturate: %v", err)
		}
		tb.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
