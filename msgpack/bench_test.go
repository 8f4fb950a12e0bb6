package msgpack_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	vmsgpack "github.com/vmihailenco/msgpack/v5"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/msgpack"
)

// Message and Channel are a chat channel's recent messages, the kind of
// document packcache caches.
type Message struct {
	ID     int64     `json:"id"`
	Author string    `json:"author"`
	Text   string    `json:"text"`
	Sent   time.Time `json:"sent"`
	Likes  []string  `json:"likes,omitempty"`
}

type Channel struct {
	ID       string    `json:"id"`
	Title    string    `json:"title"`
	Messages []Message `json:"messages"`
}

// makeChannel returns a channel of count messages, about 385 bytes of JSON
// each: 340 make about 128 KB.
func makeChannel(count int) Channel {
	r := rand.New(rand.NewPCG(42, 42))
	ch := Channel{ID: "ch-42", Title: "Course announcements"}
	base := time.Date(2026, 9, 1, 8, 0, 0, 0, time.UTC)
	for i := range count {
		var sb strings.Builder
		for w := range 20 + r.IntN(40) {
			if w > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[r.IntN(len(words))])
		}
		m := Message{
			ID:     int64(1_000_000 + i),
			Author: fmt.Sprintf("student%04d", r.IntN(5000)),
			Text:   sb.String(),
			Sent:   base.Add(time.Duration(i)*37*time.Second + time.Duration(r.IntN(1e9))),
		}
		for range r.IntN(4) {
			m.Likes = append(m.Likes, fmt.Sprintf("student%04d", r.IntN(5000)))
		}
		ch.Messages = append(ch.Messages, m)
	}
	return ch
}

// BenchmarkChannel encodes and decodes a chat channel of 340 messages with
// each serializer, reporting the serialized size (bytes) and what
// packcache's default codec, Zstandard, makes of it (zstd-bytes). The
// vmihailenco rows are the library's own Encoder and Decoder, without the
// marker and the check, for what this module adds.
func BenchmarkChannel(b *testing.B) {
	ch := makeChannel(340)
	for _, s := range []struct {
		name string
		s    packcache.Serializer
	}{{"json", packcache.JSON}, {"stdjson", stdJSON{}}, {"msgpack", msgpack.Serializer}} {
		data, err := s.s.Marshal(nil, &ch)
		if err != nil {
			b.Fatal(err)
		}
		z, err := codec.Zstd.Encode(nil, data)
		if err != nil {
			b.Fatal(err)
		}
		report := func(b *testing.B) {
			b.ReportMetric(float64(len(data)), "bytes")
			b.ReportMetric(float64(len(z)), "zstd-bytes")
		}
		b.Run(s.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			buf := data
			for b.Loop() {
				buf, _ = s.s.Marshal(buf[:0], &ch)
			}
			report(b)
		})
		b.Run(s.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var got Channel
				if err := s.s.Unmarshal(data, &got); err != nil {
					b.Fatal(err)
				}
			}
			report(b)
		})
	}
	// The library configured as Serializer configures it (json tags,
	// compact integers, loose interfaces), without the marker and check.
	var buf bytes.Buffer
	enc := vmsgpack.NewEncoder(&buf)
	enc.SetCustomStructTag("json")
	enc.UseCompactInts(true)
	if err := enc.Encode(&ch); err != nil {
		b.Fatal(err)
	}
	data := bytes.Clone(buf.Bytes())
	b.Run("vmihailenco/encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf.Reset()
			if err := enc.Encode(&ch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
	b.Run("vmihailenco/decode", func(b *testing.B) {
		var r bytes.Reader
		dec := vmsgpack.NewDecoder(&r)
		dec.SetCustomStructTag("json")
		dec.UseLooseInterfaceDecoding(true)
		b.ReportAllocs()
		for b.Loop() {
			r.Reset(data)
			dec.ResetReader(&r)
			var got Channel
			if err := dec.Decode(&got); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
}
