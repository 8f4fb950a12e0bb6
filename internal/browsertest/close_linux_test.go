package browsertest

import (
	"context"
	"os"
	"testing"
)

// TestCloseEndsEverything checks that Close leaves no process of the
// browser's alive, the crash handler that leaves its process group
// included, and removes the temporary directory.
func TestCloseEndsEverything(t *testing.T) {
	t.Parallel()
	b, err := Launch(context.Background(), Require(t))
	if err != nil {
		t.Fatal(err)
	}
	pgid, dir := b.cmd.Process.Pid, b.dir
	if pids := leftovers(pgid, []byte(dir)); len(pids) < 2 {
		t.Fatalf("a running browser has processes %v, want several", pids)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if pids := leftovers(pgid, []byte(dir)); len(pids) != 0 {
		t.Errorf("after Close, processes %v of the browser are alive", pids)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after Close, the browser's directory %s: %v, want it gone", dir, err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
