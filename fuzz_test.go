package packcache_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

const fuzzLimit = 1 << 20

// FuzzGet runs the whole Get path over arbitrary stored bytes: the value is
// written to a real Redis (one server per fuzzing process) and read back
// through a Cache[[]byte] and a Cache[Channel] with WithMaxValueSize(1 MiB).
// Get must never panic; it must agree with codec.DecodeValue, the format's
// reference, on whether and how the value decodes; every error must be one
// of the typed ones and name the key; a []byte Get of a plain value returns
// the bytes as stored; a Channel Get returns what encoding/json makes of
// the decoded bytes; and a Get never changes what Redis holds.
//
// The seed corpus in testdata/fuzz/FuzzGet holds the codec package's golden
// values (added here too when codec/testdata/golden exists), a tombstone,
// a lease, gzip streams and hostile values.
func FuzzGet(f *testing.F) {
	if golden, _ := filepath.Glob(filepath.Join("codec", "testdata", "golden", "*.bin")); len(golden) > 0 {
		for _, name := range golden {
			if b, err := os.ReadFile(name); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte{codec.HeaderTombstone})
	f.Add([]byte{codec.HeaderLease, 'x'})
	f.Add([]byte(`{"id":"c","title":"t","messages":[]}`))

	s := redistest.Start(f)
	rdb := s.Client(f)
	// No share window: each iteration writes the key behind the caches'
	// backs, and must not be answered with the previous iteration's value.
	cb := mustNew[[]byte](f, rdb, packcache.WithMaxValueSize(fuzzLimit), packcache.WithShareWindow(packcache.Off))
	cc := mustNew[Channel](f, rdb, packcache.WithMaxValueSize(fuzzLimit), packcache.WithShareWindow(packcache.Off))
	typed := []error{packcache.ErrUnknownHeader, codec.ErrUnknownDictionary, packcache.ErrCorrupt, packcache.ErrTooLarge, packcache.ErrSerialization}
	kindOf := func(err error) error {
		for _, k := range typed {
			if errors.Is(err, k) {
				return k
			}
		}
		return nil
	}
	const key = "fuzz:value"

	f.Fuzz(func(t *testing.T, value []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rdb.Set(ctx, key, value, 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		vb, errB := cb.Get(ctx, key)
		vc, errC := cc.Get(ctx, key)
		if after, err := rdb.Get(ctx, key).Bytes(); err != nil || !bytes.Equal(after, value) {
			t.Fatalf("Get changed the stored value (%v)", err)
		}

		if len(value) == 1 && value[0] == codec.HeaderTombstone {
			if !errors.Is(errB, packcache.ErrNotFound) || !errors.Is(errC, packcache.ErrNotFound) {
				t.Fatalf("tombstone: %v / %v, want ErrNotFound", errB, errC)
			}
			return
		}
		// A value beginning with the lease byte is a load in progress
		// (FORMAT.md section 2.2), whatever follows: a miss, never data.
		if len(value) > 0 && value[0] == codec.HeaderLease {
			if !errors.Is(errB, packcache.ErrMiss) || !errors.Is(errC, packcache.ErrMiss) {
				t.Fatalf("lease: %v / %v, want ErrMiss", errB, errC)
			}
			return
		}
		// An envelope (FORMAT.md section 2.4) holds a value and its groups:
		// a value whose groups are not current (here: never made) is a
		// miss.
		if _, _, perr := codec.ParseEnvelope(value); perr == nil {
			for _, err := range []error{errB, errC} {
				if err != nil && !errors.Is(err, packcache.ErrMiss) && kindOf(err) == nil {
					t.Fatalf("envelope: %v, want a miss, a value or a typed error", err)
				}
			}
			return
		} else if len(value) > 0 && value[0] == codec.HeaderExtended {
			// A malformed envelope, or one naming a field this reader does
			// not know: corrupt or unknown, never a value.
			for _, err := range []error{errB, errC} {
				if !errors.Is(err, packcache.ErrCorrupt) && !errors.Is(err, packcache.ErrUnknownHeader) {
					t.Fatalf("malformed envelope (%v): %v, want ErrCorrupt or ErrUnknownHeader", perr, err)
				}
			}
			return
		}
		for _, err := range []error{errB, errC} {
			if err == nil {
				continue
			}
			var e *packcache.Error
			if kindOf(err) == nil || !errors.As(err, &e) || e.Key != key || e.Op != "get" {
				t.Fatalf("error is not a typed *Error naming the key: %v", err)
			}
		}

		want, wantErr := codec.DecodeValue(nil, value, fuzzLimit)
		if wantErr != nil {
			k := kindOf(wantErr)
			if !errors.Is(errB, k) || !errors.Is(errC, k) {
				t.Fatalf("DecodeValue fails with %v; Get: %v / %v", wantErr, errB, errC)
			}
			return
		}
		if errB != nil {
			t.Fatalf("DecodeValue decodes %d bytes; Cache[[]byte].Get: %v", len(want), errB)
		}
		if !bytes.Equal(vb, want) {
			t.Fatalf("Cache[[]byte].Get returned %d bytes that differ from DecodeValue's %d", len(vb), len(want))
		}
		if len(value) > 0 && !codec.IsHeader(value[0]) && !bytes.Equal(vb, value) {
			t.Fatalf("plain value not returned as stored")
		}
		// The JSON serializer skips a leading UTF-8 byte-order mark
		// (FORMAT.md); otherwise it must decode as encoding/json does.
		var wantC Channel
		jerr := json.Unmarshal(bytes.TrimPrefix(want, []byte("\xef\xbb\xbf")), &wantC)
		switch {
		case jerr != nil && !errors.Is(errC, packcache.ErrSerialization):
			t.Fatalf("encoding/json fails (%v); Cache[Channel].Get: %v", jerr, errC)
		case jerr == nil && errC != nil:
			t.Fatalf("encoding/json decodes; Cache[Channel].Get: %v", errC)
		case jerr == nil && !reflect.DeepEqual(vc, wantC):
			t.Fatalf("Cache[Channel].Get = %+v, encoding/json gives %+v", vc, wantC)
		}
	})
}
