package codec

import "io"

// A HeadReader reads Head, then Rest. A Decode that rewrites the first
// bytes of a payload before a stream decoder reads it, as the zstd codec
// lowers the window a frame declares to what the limit lets it use, reads
// a rewritten copy of the head and the rest of the payload through it,
// without copying the rest. Unlike the reader io.MultiReader returns, it is
// a plain value: a pooled decoder can keep one and set it for each payload
// without allocating.
type HeadReader struct {
	Head, Rest []byte
}

// Read reads from Head until it is empty, then from Rest. It returns io.EOF
// when both are empty.
func (r *HeadReader) Read(p []byte) (int, error) {
	if len(r.Head) == 0 {
		r.Head, r.Rest = r.Rest, nil
		if len(r.Head) == 0 {
			return 0, io.EOF
		}
	}
	n := copy(p, r.Head)
	r.Head = r.Head[n:]
	return n, nil
}
