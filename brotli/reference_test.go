package brotli_test

import (
	"bytes"
	"errors"
	"os/exec"
	"testing"

	"github.com/packcache/packcache/brotli"
	"github.com/packcache/packcache/codec"
)

// TestReferenceCLI checks the payload against the reference implementation,
// the brotli command line tool, when it is on PATH: it decodes what Encode
// writes, and Decode reads what it writes at its defaults (quality 11,
// window 2^24) and at its largest standard window with a limit that makes
// Decode lower the window.
func TestReferenceCLI(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("brotli")
	if err != nil {
		t.Skip("brotli command not on PATH")
	}
	run := func(stdin []byte, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Stdin = bytes.NewReader(stdin)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("brotli %v: %v: %s", args, err, stderr.Bytes())
		}
		return out.Bytes()
	}
	// Over the least window (256 KiB), under 512 KiB: every window the
	// reference writes above 2^19 is lowered to 2^19 by a limit of
	// len(doc), and quality 11 costs seconds a megabyte, here and in the
	// reference.
	doc := chatJSON(300 << 10)
	for _, q := range []int{0, 1, 5, 11} {
		if q == 11 && (testing.Short() || raceEnabled) {
			continue
		}
		p := mustEncode(t, brotli.New(q), doc)
		if got := run(p, "-d", "-c"); !bytes.Equal(got, doc) {
			t.Errorf("quality %d: brotli -d gave %d bytes for %d", q, len(got), len(doc))
		}
	}
	runs := [][]string{{"-c", "-q", "5", "-w", "24"}, {"-c", "-q", "1", "-w", "18"}}
	if !testing.Short() && !raceEnabled {
		runs = append(runs, []string{"-c"}) // quality 11
	}
	for _, args := range runs {
		p := run(doc, args...)
		for _, limit := range []int{len(doc), 1 << 30} {
			if got, err := registered.Decode(nil, p, limit); err != nil || !bytes.Equal(got, doc) {
				t.Errorf("brotli %v, limit %d: %d bytes, %v", args, limit, len(got), err)
			}
		}
		if _, err := registered.Decode(nil, p, len(doc)-1); !errors.Is(err, codec.ErrTooLarge) {
			t.Errorf("brotli %v, limit %d: %v, want ErrTooLarge", args, len(doc)-1, err)
		}
	}
}

// TestTrailingAfterReadBoundary puts bytes after a stream that ends exactly
// where one of the decoder's 32 KiB reads of its input ends (Decode hands
// it the first byte, then the rest), so that they arrive in a read of
// their own: they are still refused.
func TestTrailingAfterReadBoundary(t *testing.T) {
	c := brotli.New(0)
	for n := 32 << 10; n > 32<<10-64; n-- {
		p := mustEncode(t, c, randomBytes(n, 11))
		if len(p) != 1+32<<10 {
			continue
		}
		if out, err := c.Decode(nil, p, n); err != nil || len(out) != n {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if _, err := c.Decode(nil, append(p, 0), n+1); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("trailing byte after a %d-byte stream: %v, want ErrCorrupt", len(p), err)
		}
		return
	}
	t.Fatal("found no input whose stream is 32 KiB + 1 bytes")
}
