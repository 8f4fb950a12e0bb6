package codec

import (
	"errors"
	"fmt"
	"io"
	"slices"
)

// corruptf and tooLargef build the errors Decode returns. The sentinel comes
// first so errors.Is works for callers, and a library's own error is kept
// with %w as well so a debugging caller can still see exactly what failed.
func corruptf(name, format string, args ...any) error {
	return fmt.Errorf("codec %s: %w: %s", name, ErrCorrupt, fmt.Sprintf(format, args...))
}

func corruptErr(name string, err error) error {
	return fmt.Errorf("codec %s: %w: %w", name, ErrCorrupt, err)
}

func tooLargef(name string, size uint64, limit int) error {
	return fmt.Errorf("codec %s: %w: %d bytes, limit %d", name, ErrTooLarge, size, limit)
}

// errOverLimit is what readLimited reports when the stream holds more than
// the limit; callers turn it into an ErrTooLarge naming their codec.
var errOverLimit = errors.New("over limit")

// ReadLimited appends the rest of r to dst, reading at most limit bytes:
// the bounded read of a stream that does not record its decoded size, for
// a user codec's Decode (the built-in ones use it). It grows dst from
// sizeHint, never trusting a size the stream claims, so the memory it takes
// follows what was decoded: under twice that, and under twice limit in
// all. A stream that holds more than limit bytes is an error matching
// ErrTooLarge; any other error is r's. On error it returns dst as it was.
func ReadLimited(dst []byte, r io.Reader, limit, sizeHint int) ([]byte, error) {
	out, err := readLimited(dst, r, limit, sizeHint)
	if err == errOverLimit {
		return out, fmt.Errorf("codec: %w: stream longer than %d bytes", ErrTooLarge, limit)
	}
	return out, err
}

// readLimited appends the rest of r to dst, reading at most limit bytes.
// It grows dst geometrically from sizeHint rather than trusting any size the
// stream claims, so the memory it takes follows what was actually decoded:
// under twice that, and under twice limit in all. On error it returns dst as
// it was.
func readLimited(dst []byte, r io.Reader, limit, sizeHint int) ([]byte, error) {
	start := len(dst)
	for {
		n := len(dst) - start
		if n == limit {
			// One more byte tells a stream of exactly limit bytes from a
			// longer one without buffering any of the excess.
			var one [1]byte
			k, err := io.ReadFull(r, one[:])
			switch {
			case k > 0:
				return dst[:start], errOverLimit
			case err == io.EOF:
				return dst, nil
			default:
				return dst[:start], err
			}
		}
		if len(dst) == cap(dst) {
			// Double, but go straight to the limit when the step after
			// this one would reach it anyway: the last steps are the
			// largest, and each copies everything read so far.
			grow := max(sizeHint, n, 512)
			if n+2*grow >= limit {
				grow = limit - n
			}
			dst = slices.Grow(dst, grow)
		}
		// Not start+limit: limit may be math.MaxInt.
		end := cap(dst)
		if room := limit - n; end-len(dst) > room {
			end = len(dst) + room
		}
		k, err := r.Read(dst[len(dst):end])
		dst = dst[:len(dst)+k]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst[:start], err
		}
	}
}

// clampLimit makes a negative limit mean zero, so every comparison against
// it can be done in uint64 without surprises.
func clampLimit(limit int) int {
	return max(limit, 0)
}
