package msgpack

import (
	"fmt"
	"testing"
)

// BenchmarkCheck measures the well-formedness check Unmarshal runs before
// decoding, on a payload of about 128 KB shaped like a chat channel.
func BenchmarkCheck(b *testing.B) {
	var msgs []map[string]any
	for i := range 340 {
		msgs = append(msgs, map[string]any{
			"id": 1_000_000 + i, "author": fmt.Sprintf("student%04d", i%5000),
			"text":  fmt.Sprintf("%0300d", i),
			"likes": []string{"student0001", "student0002"},
		})
	}
	p, err := Serializer.Marshal(nil, map[string]any{"id": "ch-42", "messages": msgs})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := check(p[1:]); err != nil {
			b.Fatal(err)
		}
	}
}
