package packcache_test

import (
	"bytes"
	"compress/gzip"
	"testing"
)

func gzipBytes(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
