package codec

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// Gzip is read only: a value that starts with the gzip magic 1f 8b is a gzip
// stream (RFC 1952), header byte included, so caches that stored gzip keep
// working. No Codec writes it and Lookup does not return one for it.

// gzipReaders pools readers, as each holds a DEFLATE window and tables that
// cost more to allocate than a small value costs to decode.
var gzipReaders sync.Pool // *gzipReader

type gzipReader struct {
	src bytes.Reader
	zr  gzip.Reader
}

// decodeGzip appends the decoded gzip stream value to dst, at most limit
// bytes. Members are concatenated as gunzip does (RFC 1952, section 2.2);
// anything after the last member that is not another member is corrupt.
func decodeGzip(dst, value []byte, limit int) ([]byte, error) {
	limit = clampLimit(limit)
	r, _ := gzipReaders.Get().(*gzipReader)
	if r == nil {
		r = new(gzipReader)
	}
	r.src.Reset(value)
	err := r.zr.Reset(&r.src)
	if err == nil {
		// DEFLATE expands at most about 1032 times, and JSON mostly far
		// less, so start small and let readLimited grow.
		dst, err = readLimited(dst, &r.zr, limit, 4*len(value))
	}
	// Drop the reference to value before pooling.
	r.src.Reset(nil)
	gzipReaders.Put(r)
	switch {
	case err == nil:
		return dst, nil
	case err == errOverLimit:
		return dst, fmt.Errorf("codec gzip: %w: stream decodes to more than %d bytes", ErrTooLarge, limit)
	default:
		return dst, corruptErr("gzip", err)
	}
}
