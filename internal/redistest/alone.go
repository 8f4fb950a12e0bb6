package redistest

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// aloneEnv names, in a process Alone started, the test it runs.
const aloneEnv = "PACKCACHE_TEST_ALONE"

// Alone runs the calling top-level test again in a process of its own
// (the same test binary, -test.run naming only it) and reports false,
// passing or failing t as that run does, with its output in t's log; in
// that process it reports true, and the test goes on.
//
// A test that measures the process (its heap, what it allocates, its
// goroutines, the servers it runs) calls it first, and may then call
// t.Parallel and run beside the others: in the suite's process, what it
// measures also moves with what the other tests do. On a busy machine the
// root package's TestHeapPerColdCall once measured 10,303 B per call in
// the suite's process, where it measures 6,100 B alone.
func Alone(t *testing.T) bool {
	t.Helper()
	if os.Getenv(aloneEnv) == t.Name() {
		return true
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v"}
	if f := flag.Lookup("test.timeout"); f != nil {
		args = append(args, "-test.timeout="+f.Value.String())
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), aloneEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("%s, in a process of its own:\n%s", t.Name(), out)
	switch {
	case err != nil:
		t.Fatalf("%s in a process of its own: %v", t.Name(), err)
	case bytes.Contains(out, []byte("--- SKIP: "+t.Name())):
		t.Skip("skipped in its own process (see above)")
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name())):
		t.Fatalf("%s in a process of its own did not report passing", t.Name())
	}
	return false
}
