package packcache_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// Hostile stored values: whatever bytes a key holds, Get returns a value or
// one of the typed errors naming the key, never panics, never allocates much
// more than the configured maximum value size, and never changes the stored
// bytes.

const hostileLimit = 1 << 20 // WithMaxValueSize in these tests

// specHeader is FORMAT.md's header space, written out rather than taken
// from codec.IsHeader: 0x00-0x08, 0x0B, 0x0C, 0x0E-0x1F and 0x7F. Every
// other first byte (JSON whitespace, and every byte that can begin JSON
// text or is not ASCII) makes a value plain.
func specHeader(b byte) bool {
	return b <= 0x08 || b == 0x0b || b == 0x0c || (b >= 0x0e && b <= 0x1f) || b == 0x7f
}

// outcome classifies what a Get returned, for tables and messages.
func outcome(err error) string {
	switch {
	case err == nil:
		return "value"
	case errors.Is(err, packcache.ErrNotFound):
		return "ErrNotFound"
	case errors.Is(err, packcache.ErrMiss):
		return "ErrMiss"
	case errors.Is(err, packcache.ErrUnknownHeader):
		return "ErrUnknownHeader"
	case errors.Is(err, packcache.ErrCorrupt):
		return "ErrCorrupt"
	case errors.Is(err, packcache.ErrTooLarge):
		return "ErrTooLarge"
	case errors.Is(err, packcache.ErrSerialization):
		return "ErrSerialization"
	case errors.Is(err, packcache.ErrRedis):
		return "ErrRedis"
	default:
		return "untyped(" + err.Error() + ")"
	}
}

// getNoPanic calls get, turning a panic into a test error.
func getNoPanic[T any](t *testing.T, what string, get func() (T, error)) (v T, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s: Get panicked: %v", what, r)
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return get()
}

// TestHostileEveryHeaderByte stores every first byte 0..255 alone, followed
// by one byte and followed by 64 bytes of garbage, and checks what Get of
// Cache[Channel] and Cache[[]byte] makes of each against FORMAT.md's header
// space: plain bytes are returned as stored (or fail JSON decoding, for
// Channel), 0x01 is the None codec, 0x02-0x04 are codecs whose garbage is
// ErrCorrupt or ErrTooLarge, 0x0E alone is the tombstone (ErrNotFound), 0x0C
// begins a lease (ErrMiss), and every other header byte is ErrUnknownHeader
// naming the byte.
func TestHostileEveryHeaderByte(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	cc := mustNew[Channel](t, rdb, packcache.WithMaxValueSize(hostileLimit))
	cb := mustNew[[]byte](t, rdb, packcache.WithMaxValueSize(hostileLimit))

	r := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = byte(r.Uint32())
	}
	garbage[0] = 0x5a // not 0x8b: 0x1f followed by it is not gzip
	suffixes := [][]byte{nil, garbage[:1], garbage}

	values := map[string][]byte{}
	pipe := rdb.Pipeline()
	for b := range 256 {
		for _, suf := range suffixes {
			k := fmt.Sprintf("hdr:%02x:%d", b, len(suf))
			v := append([]byte{byte(b)}, suf...)
			values[k] = v
			pipe.Set(ctx, k, v, 0)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	table := map[string][]string{} // outcome for Channel / []byte -> header bytes
	for b := range 256 {
		hb := byte(b)
		if codec.IsHeader(hb) != specHeader(hb) {
			t.Errorf("codec.IsHeader(0x%02x) = %v, FORMAT.md says %v", hb, codec.IsHeader(hb), specHeader(hb))
		}
		for _, suf := range suffixes {
			k := fmt.Sprintf("hdr:%02x:%d", b, len(suf))
			stored := values[k]
			vc, errC := getNoPanic(t, k, func() (Channel, error) { return cc.Get(ctx, k) })
			vb, errB := getNoPanic(t, k, func() ([]byte, error) { return cb.Get(ctx, k) })
			oc, ob := outcome(errC), outcome(errB)
			if len(suf) == len(garbage) {
				key := oc + " / " + ob
				table[key] = append(table[key], fmt.Sprintf("%02x", b))
			}
			for _, e := range []error{errC, errB} {
				if e != nil && !errors.Is(e, packcache.ErrNotFound) && !errors.Is(e, packcache.ErrMiss) && !isKeyErr(e, k) {
					t.Errorf("%s: error does not name the key: %v", k, e)
				}
			}

			var wantC, wantB []string // allowed outcomes
			switch {
			case !specHeader(hb):
				wantC, wantB = []string{"ErrSerialization"}, []string{"value"}
				if errB == nil && !bytes.Equal(vb, stored) {
					t.Errorf("%s: plain value returned as %x, stored %x", k, vb, stored)
				}
			case hb == codec.HeaderNone:
				wantC, wantB = []string{"ErrSerialization"}, []string{"value"}
				if errB == nil && !bytes.Equal(vb, stored[1:]) {
					t.Errorf("%s: None value returned as %x, want %x", k, vb, stored[1:])
				}
			case isRegistered(hb):
				// The built-in codecs, and any user codec another test of
				// this binary registered (the registry is process-wide).
				wantC = []string{"ErrCorrupt", "ErrTooLarge"}
				wantB = wantC
			case hb == codec.HeaderTombstone && len(suf) == 0:
				wantC, wantB = []string{"ErrNotFound"}, []string{"ErrNotFound"}
			case hb == codec.HeaderLease:
				// A lease: a load in progress, which a Get without a
				// loader reports as a miss, never as data or an error.
				wantC, wantB = []string{"ErrMiss"}, []string{"ErrMiss"}
			case hb == codec.HeaderExtended:
				// An envelope (groups, a TTL: FORMAT.md 2.4) around
				// garbage: malformed, or naming a field this reader does
				// not know.
				wantC = []string{"ErrCorrupt", "ErrUnknownHeader"}
				wantB = wantC
			default:
				wantC, wantB = []string{"ErrUnknownHeader"}, []string{"ErrUnknownHeader"}
				for _, e := range []error{errC, errB} {
					var he *codec.HeaderError
					if errors.As(e, &he) && he.Byte != hb {
						t.Errorf("%s: HeaderError names 0x%02x", k, he.Byte)
					}
				}
			}
			if !contains(wantC, oc) {
				t.Errorf("%s (%x): Cache[Channel].Get = %+v, %v (%s); want %v", k, stored, vc, errC, oc, wantC)
			}
			if !contains(wantB, ob) {
				t.Errorf("%s (%x): Cache[[]byte].Get = %x, %v (%s); want %v", k, stored, vb, errB, ob, wantB)
			}
			if after := rawGet(t, rdb, k); !bytes.Equal(after, stored) {
				t.Errorf("%s: Get changed the stored value from %x to %x", k, stored, after)
			}
		}
	}
	for k, bs := range table {
		t.Logf("header byte + 64 garbage bytes, Channel / []byte = %s: %s", k, strings.Join(bs, " "))
	}
	if st := cc.Stats(); st.DecodeErrors == 0 || st.NotFoundHits != 1 {
		t.Errorf("Channel cache stats: %d decode errors, %d not-found hits", st.DecodeErrors, st.NotFoundHits)
	}
}

func contains(set []string, s string) bool {
	for _, x := range set {
		if x == s {
			return true
		}
	}
	return false
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// zstdStreamBomb compresses n zero bytes with the streaming encoder, which
// does not know the size in advance and so writes a frame without a
// content size.
func zstdStreamBomb(t testing.TB, n int64) []byte {
	var buf bytes.Buffer
	buf.WriteByte(codec.HeaderZstd)
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(enc, zeros{}, n); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	var h zstd.Header
	if err := h.Decode(buf.Bytes()[1:]); err != nil || h.HasFCS || h.SingleSegment {
		t.Fatalf("streaming encoder wrote a frame with header %+v, %v; want no content size", h, err)
	}
	return buf.Bytes()
}

// withFCS returns a copy of value, a header byte and a zstd frame without
// a content size or dictionary, with a 4- or 8-byte Frame_Content_Size of
// size added to its frame header.
func withFCS(value []byte, size uint64) []byte {
	out := append([]byte{}, value[:6]...) // header byte, magic, descriptor, window descriptor
	var fcs []byte
	if size <= 0xffffffff {
		out[5] |= 2 << 6
		fcs = binary.LittleEndian.AppendUint32(nil, uint32(size))
	} else {
		out[5] |= 3 << 6
		fcs = binary.LittleEndian.AppendUint64(nil, size)
	}
	out = append(out, value[6])
	out = append(out, fcs...)
	return append(out, value[7:]...)
}

// zstdRLE builds a stored zstd value by hand: a frame of RLE blocks of up
// to 128 KiB of byte c each, n bytes in all, with the given window
// descriptor and, when fcs >= 0, that Frame_Content_Size (8 bytes).
func zstdRLE(n int64, c byte, wd byte, fcs int64) []byte {
	v := []byte{codec.HeaderZstd, 0x28, 0xb5, 0x2f, 0xfd}
	if fcs >= 0 {
		v = append(v, 3<<6, wd)
		v = binary.LittleEndian.AppendUint64(v, uint64(fcs))
	} else {
		v = append(v, 0, wd)
	}
	for n > 0 {
		size := min(n, 128<<10)
		n -= size
		bh := uint32(size)<<3 | 1<<1 // RLE_Block
		if n == 0 {
			bh |= 1 // Last_Block
		}
		v = append(v, byte(bh), byte(bh>>8), byte(bh>>16), c)
	}
	return v
}

func gzipBomb(t testing.TB, n int64) []byte {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(w, zeros{}, n); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func frame(t testing.TB, c codec.Codec, src []byte) []byte {
	v, err := codec.AppendValue(nil, c, src)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// allocBound is what one Get of a hostile value may allocate: the limit
// plus 2 MiB for the rest (the Redis reply itself, at most a few hundred KB
// here, go-redis's buffers, the decoder's state, errors). A stream decoder
// that does not know the size grows its output geometrically up to the
// limit (readLimited: at most about twice the limit in all), and the zstd
// stream decoder needs a window of the limit plus one block; those are
// allowed another limit plus 1 MiB. Measured (limit 1 MiB): at most about
// 2.0 MB for sized formats, 4.0 MB for streams (the zstd bomb decoded into
// a small pooled buffer: 2 MiB of geometric growth plus a 1.1 MiB window).
const (
	allocBound       = hostileLimit + 2<<20
	streamAllocBound = 2*hostileLimit + 3<<20
)

// TestHostileValuesBoundedAllocation stores truncated frames of every codec,
// frames whose size fields lie, decompression bombs and values of the wrong
// type, and checks each Get: the typed error naming the key, the stored
// bytes unchanged, and the memory one Get allocates (runtime.MemStats
// TotalAlloc around it, after a GC) within the bounds above.
func TestHostileValuesBoundedAllocation(t *testing.T) {
	// Beside the other tests, but measuring allocation in a process of
	// its own.
	t.Parallel()
	if !redistest.Alone(t) {
		return
	}
	s, rdb := single(t)
	redistest.RequireReal(t, s, "stores values of hundreds of KB")
	ctx := ctxT(t)
	cc := mustNew[Channel](t, rdb, packcache.WithMaxValueSize(hostileLimit))
	cb := mustNew[[]byte](t, rdb, packcache.WithMaxValueSize(hostileLimit))

	doc, err := json.Marshal(makeChannel(11, 200<<10))
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name         string
		value        []byte
		wantC, wantB []string // allowed outcomes for Channel and []byte
		stream       bool     // decoded as a stream of unknown size
	}
	var cases []tc
	add := func(name string, v []byte, wantC, wantB []string, stream bool) {
		cases = append(cases, tc{name, v, wantC, wantB, stream})
	}
	corrupt := []string{"ErrCorrupt"}
	tooLarge := []string{"ErrTooLarge"}
	ser := []string{"ErrSerialization"}
	ok := []string{"value"}

	// Truncated frames of every format.
	framed := map[string][]byte{
		"none":   frame(t, codec.None, doc),
		"lz4":    frame(t, codec.LZ4, doc),
		"snappy": frame(t, codec.Snappy, doc),
		"zstd":   frame(t, codec.Zstd, doc),
		"gzip":   gzipBytes(t, doc),
	}
	for _, name := range []string{"none", "lz4", "snappy", "zstd", "gzip"} {
		v := framed[name]
		for _, cut := range []int{1, 2, 5, 12, len(v) / 3, len(v) / 2, len(v) - 4, len(v) - 1} {
			wc, wb := corrupt, corrupt
			switch {
			case name == "none":
				wc, wb = ser, ok
			case name == "gzip" && cut == 1:
				wc, wb = []string{"ErrUnknownHeader"}, []string{"ErrUnknownHeader"}
			}
			add(fmt.Sprintf("truncated-%s-%d", name, cut), v[:cut], wc, wb, name == "gzip")
		}
	}
	// Size fields that lie.
	add("lz4-claims-4GiB", append([]byte{codec.HeaderLZ4, 0xff, 0xff, 0xff, 0xff}, bytes.Repeat([]byte{0x1f}, 32)...), tooLarge, tooLarge, false)
	add("lz4-claims-limit", binary.LittleEndian.AppendUint32([]byte{codec.HeaderLZ4}, hostileLimit), corrupt, corrupt, false)
	add("lz4-claims-limit+1", binary.LittleEndian.AppendUint32([]byte{codec.HeaderLZ4}, hostileLimit+1), tooLarge, tooLarge, false)
	add("snappy-claims-4GiB", append([]byte{codec.HeaderSnappy, 0xff, 0xff, 0xff, 0xff, 0x0f}, bytes.Repeat([]byte{0}, 32)...), tooLarge, tooLarge, false)
	add("snappy-claims-limit", append(binary.AppendUvarint([]byte{codec.HeaderSnappy}, hostileLimit), 0, 'x'), corrupt, corrupt, false)
	add("zstd-fcs-1TiB", zstdRLE(1000, '[', 0x58, 1<<40), tooLarge, tooLarge, false)
	add("zstd-fcs-limit+1", zstdRLE(hostileLimit+1, ' ', 0x58, hostileLimit+1), tooLarge, tooLarge, false)
	// A frame that says 512 KiB and holds 64 MiB: the decoder must stop at
	// the size it allocated for.
	add("zstd-fcs-lies", zstdRLE(64<<20, ' ', 0x58, 512<<10), []string{"ErrCorrupt", "ErrTooLarge"}, []string{"ErrCorrupt", "ErrTooLarge"}, false)
	// Decompression bombs: 1 GiB of zeros.
	bomb := zstdStreamBomb(t, 1<<30)
	t.Logf("zstd bomb: 1 GiB of zeros in %d bytes (streaming encoder, no content size)", len(bomb))
	add("zstd-bomb-1GiB", bomb, tooLarge, tooLarge, true)
	add("zstd-bomb-1GiB-with-size", withFCS(bomb, 1<<30), tooLarge, tooLarge, false)
	add("zstd-rle-bomb-1GiB", zstdRLE(1<<30, 0, 0x58, -1), tooLarge, tooLarge, true)
	add("zstd-rle-bomb-just-over", zstdRLE(hostileLimit+1, 0, 0x58, -1), tooLarge, tooLarge, true)
	// A frame declaring a 3.75 TB window that decodes to 100 bytes: the
	// window must not be allocated.
	add("zstd-2GiB-window", zstdRLE(100, '7', 0xa8, -1), ser, ok, true)
	// Past what the reference decoder accepts (2 GiB on 64-bit).
	add("zstd-3.75TB-window", zstdRLE(100, '7', 0xff, -1), corrupt, corrupt, true)
	gbomb := gzipBomb(t, 64<<20)
	t.Logf("gzip bomb: 64 MiB of zeros in %d bytes", len(gbomb))
	add("gzip-bomb-64MiB", gbomb, tooLarge, tooLarge, true)
	add("gzip-trailing-garbage", append(gzipBytes(t, []byte(`{"id":"x"}`)), 0xde, 0xad), corrupt, corrupt, true)
	// Values that decode but are not a Channel.
	add("wrong-type-array", []byte(`[1,2,3]`), ser, ok, false)
	add("wrong-type-string", []byte(`"channel"`), ser, ok, false)
	bigArray := []byte("[" + strings.Repeat("12345678,", 100_000) + "0]")
	add("wrong-type-zstd-900KB", frame(t, codec.Zstd, bigArray), ser, ok, false)
	add("not-utf8", []byte("\xff\xfe\xfd\xfc"), ser, ok, false)
	add("plain-over-limit", bytes.Repeat([]byte{' '}, hostileLimit+1), tooLarge, tooLarge, false)
	add("none-over-limit", frame(t, codec.None, bytes.Repeat([]byte{' '}, hostileLimit+1)), tooLarge, tooLarge, false)

	measure := func(get func() error) (uint64, error) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := get()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, err
	}
	var worst, worstStream uint64
	var worstName, worstStreamName string
	for _, c := range cases {
		if err := rdb.Set(ctx, c.name, c.value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, typ := range []string{"Channel", "[]byte"} {
			want := c.wantC
			get := func() error {
				_, err := getNoPanic(t, c.name, func() (Channel, error) { return cc.Get(ctx, c.name) })
				return err
			}
			if typ == "[]byte" {
				want = c.wantB
				get = func() error {
					_, err := getNoPanic(t, c.name, func() ([]byte, error) { return cb.Get(ctx, c.name) })
					return err
				}
			}
			// Twice: the first Get may fill pools (decoders), the
			// second shows the steady cost. Both are bounded.
			for run := range 2 {
				n, err := measure(get)
				if got := outcome(err); !contains(want, got) {
					t.Errorf("%s: Cache[%s].Get: %v (%s), want %v", c.name, typ, err, got, want)
				}
				if err != nil && !isKeyErr(err, c.name) {
					t.Errorf("%s: Cache[%s].Get: error does not name the key: %v", c.name, typ, err)
				}
				bound := uint64(allocBound)
				if c.stream {
					bound = streamAllocBound
				}
				if n > bound {
					t.Errorf("%s: Cache[%s].Get (run %d) allocated %d bytes, bound %d (%d stored)", c.name, typ, run, n, bound, len(c.value))
				}
				if testing.Verbose() && (c.stream || n > hostileLimit) {
					t.Logf("%s Cache[%s] run %d: %d bytes", c.name, typ, run, n)
				}
				if c.stream && n > worstStream {
					worstStream, worstStreamName = n, c.name+" "+typ
				}
				if !c.stream && n > worst {
					worst, worstName = n, c.name+" "+typ
				}
			}
		}
		if after := rawGet(t, rdb, c.name); !bytes.Equal(after, c.value) {
			t.Errorf("%s: Get changed the stored value", c.name)
		}
	}
	t.Logf("%d hostile values; most allocated by one Get: %d bytes (%s) for sized formats, %d bytes (%s) for streams; limit %d",
		len(cases), worst, worstName, worstStream, worstStreamName, hostileLimit)
}

// TestHostileInvalidUTF8InJSONString: encoding/json replaces invalid UTF-8
// inside strings with U+FFFD rather than failing, so such a value decodes;
// the cache must hand back exactly what encoding/json makes of it and leave
// the stored bytes alone.
func TestHostileInvalidUTF8InJSONString(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	cc := mustNew[Channel](t, rdb, packcache.WithMaxValueSize(hostileLimit))
	raw := []byte("{\"id\":\"a\xff\xfeb\",\"title\":\"t\"}")
	rdb.Set(ctx, "utf8", raw, 0)
	v, err := cc.Get(ctx, "utf8")
	var want Channel
	wantErr := json.Unmarshal(raw, &want)
	if (err == nil) != (wantErr == nil) || v.ID != want.ID {
		t.Fatalf("Get = %+v, %v; encoding/json gives %+v, %v", v, err, want, wantErr)
	}
	if got := rawGet(t, rdb, "utf8"); !bytes.Equal(got, raw) {
		t.Fatal("stored value changed")
	}
	// The same bytes zstd-compressed.
	rdb.Set(ctx, "utf8z", frame(t, codec.Zstd, raw), 0)
	if v, err := cc.Get(ctx, "utf8z"); err != nil || v.ID != want.ID {
		t.Fatalf("compressed: %+v, %v", v, err)
	}
}

func isRegistered(b byte) bool {
	_, ok := codec.Lookup(b)
	return ok
}
