package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

func encode(t *testing.T, c codec.Codec, v []byte) []byte {
	t.Helper()
	out, err := codec.AppendValue(nil, c, v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func gzipped(t *testing.T, v []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(v)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestInspectDecodable(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		doc := jsonDoc(1, 5000)
		values := map[string][]byte{
			"i:plain":  doc,
			"i:none":   encode(t, codec.None, doc),
			"i:lz4hc":  encode(t, codec.LZ4Level(9), doc),
			"i:snappy": encode(t, codec.Snappy, doc),
			"i:zstd":   encode(t, codec.ZstdDefault, doc),
			"i:gzip":   gzipped(t, doc),
		}
		set(t, tg, time.Hour, values)
		tg.ResetStats(t)

		keys := []string{"i:plain", "i:none", "i:lz4hc", "i:snappy", "i:zstd", "i:gzip"}
		res := cli(t, with(tg, append([]string{"inspect", "--json"}, keys...)...)...)
		if res.code != 0 {
			t.Fatalf("exit %d, want 0", res.code)
		}
		var reports []keyReport
		if err := json.Unmarshal([]byte(res.stdout), &reports); err != nil {
			t.Fatalf("--json output: %v", err)
		}
		if len(reports) != len(keys) {
			t.Fatalf("%d reports for %d keys", len(reports), len(keys))
		}
		want := map[string]struct{ header, kind, level string }{
			"i:plain":  {"0x7b", "plain", ""},
			"i:none":   {"0x01", "none", "none has no levels"},
			"i:lz4hc":  {"0x02", "lz4", "lz4hc level"},
			"i:snappy": {"0x03", "snappy", "snappy has no levels"},
			"i:zstd":   {"0x04", "zstd", "zstd default (levels 3-5)"},
			"i:gzip":   {"0x1f", "gzip", "gzip is read only"},
		}
		for _, r := range reports {
			w := want[r.Key]
			if r.Header != w.header || r.Kind != w.kind || !strings.Contains(r.Level, w.level) {
				t.Errorf("%s: header %s kind %s level %q; want %s %s %q", r.Key, r.Header, r.Kind, r.Level, w.header, w.kind, w.level)
			}
			if r.Stored != len(values[r.Key]) || r.Decoded == nil || *r.Decoded != len(doc) {
				t.Errorf("%s: stored %d decoded %v; want %d and %d", r.Key, r.Stored, r.Decoded, len(values[r.Key]), len(doc))
			}
			if r.TTLMillis <= 0 || r.TTLMillis > time.Hour.Milliseconds() {
				t.Errorf("%s: TTL %d ms, want (0, 1h]", r.Key, r.TTLMillis)
			}
			if r.MemoryUsage < int64(r.Stored) {
				t.Errorf("%s: MEMORY USAGE %d under the stored size %d", r.Key, r.MemoryUsage, r.Stored)
			}
			var compact bytes.Buffer
			json.Compact(&compact, r.Value)
			if !bytes.Equal(compact.Bytes(), doc) {
				t.Errorf("%s: value is not the document", r.Key)
			}
		}
		// LZ4 HC levels 1-9 may write the same block for a small
		// document, but level 9 must be among those that do.
		for _, r := range reports {
			if r.Key == "i:lz4hc" && !strings.Contains(r.Level, "9") {
				t.Errorf("lz4hc level note %q does not name level 9", r.Level)
			}
		}

		// The text form pretty-prints the JSON; --raw prints it as stored.
		res = cli(t, with(tg, "inspect", "i:zstd")...)
		mustContain(t, res.stdout, "0x04 zstd", "stored/decoded", "MEMORY USAGE", "value:\n{\n  \"id\": 1,")
		res = cli(t, with(tg, "inspect", "--raw", "i:snappy")...)
		if !strings.Contains(res.stdout, string(values["i:snappy"])) {
			t.Error("--raw does not print the value as stored")
		}
		checkReadOnly(t, tg)
	})
}

func TestInspectNotValues(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		token := []byte("0123456789abcdef")
		set(t, tg, time.Minute, map[string][]byte{
			"n:lease":     append([]byte{0x0c}, token...),
			"n:tombstone": {0x0e},
		})
		res := cli(t, with(tg, "inspect", "n:lease", "n:tombstone")...)
		if res.code != 0 {
			t.Fatalf("exit %d: a lease and a tombstone are not errors", res.code)
		}
		mustContain(t, res.stdout, "lease: a load is in progress", "token   "+"30313233", "tombstone", "ttl ")
		if strings.Contains(res.stdout, "error") {
			t.Error("a lease or tombstone reported as an error")
		}
	})
}

func TestInspectUndecodable(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		doc := jsonDoc(2, 3000)
		z := encode(t, codec.Zstd, doc)
		cases := []struct {
			key   string
			value []byte
			want  []string
		}{
			{"u:user", []byte("\x12payload"), []string{"unknown header byte 0x12", "FORMAT.md section 6", "user codec 0x12"}},
			{"u:reserved", []byte("\x06payload"), []string{"unknown header byte 0x06", "FORMAT.md section 7", "future built-in codecs"}},
			{"u:ext", []byte("\x0bpayload"), []string{"envelope", "malformed envelope", "FORMAT.md section 2.4"}}, // 0x0b is the envelope now; this one runs past the value
			{"u:version", []byte("\x7fpayload"), []string{"version escape"}},
			{"u:nul", []byte("\x00"), []string{"never assigned"}},
			{"u:long0e", []byte("\x0exx"), []string{"FORMAT.md section 2.1"}},
			{"u:1f", []byte("\x1fxx"), []string{"1F not followed by 8B"}},
			{"u:corrupt", append(z[:len(z)-3:len(z)-3], 0, 0, 0), []string{"corrupt value", "FORMAT.md section 3.4"}},
			{"u:trailing", append(z[:len(z):len(z)], 'x'), []string{"corrupt value", "after the frame"}},
			{"u:lz4", []byte("\x02\xff\xff\xff\x00abc"), []string{"corrupt value", "FORMAT.md section 3.2"}},
		}
		kv := map[string][]byte{}
		for _, c := range cases {
			kv[c.key] = c.value
		}
		set(t, tg, 0, kv)
		for _, c := range cases {
			res := cli(t, with(tg, "inspect", c.key)...)
			if res.code != exitFailure {
				t.Errorf("%s: exit %d, want %d", c.key, res.code, exitFailure)
			}
			mustContain(t, res.stdout, c.want...)
			mustContain(t, res.stdout, "ttl     no expiry")
		}

		// A value over --max-value-size is too large, citing section 4.
		set(t, tg, 0, map[string][]byte{"u:big": z})
		res := cli(t, with(tg, "--max-value-size", "100", "inspect", "u:big")...)
		mustContain(t, res.stdout, "decoded size over limit", "FORMAT.md section 4", "100 bytes")
		if res.code != exitFailure {
			t.Errorf("too large: exit %d", res.code)
		}
	})
}

func TestInspectMissingAndNotString(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		tg.Client.HSet(t.Context(), "m:hash", "f", "v")
		set(t, tg, 0, map[string][]byte{"m:ok": []byte(`{"a":1}`)})
		before := snapshot(t, tg)
		res := cli(t, with(tg, "inspect", "m:missing")...)
		if res.code != exitFailure || !strings.Contains(res.stderr, "m:missing: no such key") {
			t.Errorf("missing key: exit %d, stderr %q", res.code, res.stderr)
		}
		res = cli(t, with(tg, "inspect", "m:hash")...)
		if res.code != exitFailure || !strings.Contains(res.stderr, "a hash, not a string") {
			t.Errorf("hash: exit %d, stderr %q", res.code, res.stderr)
		}
		// Good keys are still reported when others are not.
		res = cli(t, with(tg, "inspect", "m:ok", "m:missing")...)
		if res.code != exitFailure || !strings.Contains(res.stdout, `"a": 1`) {
			t.Errorf("mixed: exit %d", res.code)
		}
		sameData(t, before, snapshot(t, tg), time.Minute)
	})
}
