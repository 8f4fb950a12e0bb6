package msgpack_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	vmsgpack "github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/msgpack"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Item and Doc exercise what a cached document holds: nested slices and
// maps, times, bytes, pointers, interface values and the json tags the
// serializer falls back to.
type Item struct {
	SKU   string  `json:"sku"`
	Qty   int     `json:"qty"`
	Price float64 `json:"price"`
}

type Doc struct {
	ID       int64               `json:"id"`
	Name     string              `json:"name"`
	Tags     []string            `json:"tags"`
	Matrix   [][]int             `json:"matrix"`
	Attrs    map[string]string   `json:"attrs"`
	Groups   map[string][]Item   `json:"groups"`
	Items    []Item              `json:"items"`
	Created  time.Time           `json:"created"`
	Seen     []time.Time         `json:"seen"`
	Blob     []byte              `json:"blob"`
	Note     *string             `json:"note,omitempty"`
	Extra    map[string]any      `json:"extra"`
	Skipped  string              `json:"-"`
	Renamed  int                 `json:"n" msgpack:"renamed"`
	Children map[string][]string `json:"children,omitempty"`
}

var words = strings.Fields(`the a lecture notes exam tomorrow room please read chapter
	question answer thanks professor deadline homework assignment group project slides
	posted link meeting today week grade midterm final review session office hours`)

// makeDoc returns a Doc with n items and as many entries in its maps.
func makeDoc(seed uint64, n int) Doc {
	r := rand.New(rand.NewPCG(seed, 7))
	note := "handle with care"
	d := Doc{
		ID:       int64(seed) * 1_000_003,
		Name:     fmt.Sprintf("doc-%d", seed),
		Attrs:    map[string]string{},
		Groups:   map[string][]Item{},
		Created:  time.Date(2026, 3, 1, 12, 30, 15, 123456789, time.UTC),
		Blob:     []byte{0, 1, 2, 0xc1, 0xff},
		Note:     &note,
		Extra:    map[string]any{"s": "x", "list": []any{"a", "b"}, "map": map[string]any{"k": "v"}, "ok": true, "nothing": nil},
		Skipped:  "never stored",
		Renamed:  42,
		Children: map[string][]string{"a": {"b", "c"}, "d": {}},
	}
	for i := range n {
		it := Item{SKU: fmt.Sprintf("sku-%05d", r.IntN(100000)), Qty: r.IntN(300) - 100, Price: float64(r.IntN(100000)) / 100}
		d.Items = append(d.Items, it)
		g := words[i%len(words)]
		d.Groups[g] = append(d.Groups[g], it)
		d.Attrs[fmt.Sprintf("k%d", i)] = words[r.IntN(len(words))]
		d.Tags = append(d.Tags, words[r.IntN(len(words))])
		d.Matrix = append(d.Matrix, []int{i, -i, i * i})
		d.Seen = append(d.Seen, d.Created.Add(time.Duration(i)*time.Minute))
	}
	return d
}

// equalDoc compares Docs as values: times as instants (MessagePack
// carries no zone) and Skipped, which is never stored, not at all.
func equalDoc(t *testing.T, got, want Doc) {
	t.Helper()
	if !got.Created.Equal(want.Created) {
		t.Fatalf("Created: %v, want %v", got.Created, want.Created)
	}
	if len(got.Seen) != len(want.Seen) {
		t.Fatalf("Seen: %d times, want %d", len(got.Seen), len(want.Seen))
	}
	for i := range got.Seen {
		if !got.Seen[i].Equal(want.Seen[i]) {
			t.Fatalf("Seen[%d]: %v, want %v", i, got.Seen[i], want.Seen[i])
		}
	}
	if got.Skipped != "" {
		t.Fatalf("Skipped was stored: %q", got.Skipped)
	}
	got.Created, want.Created = time.Time{}, time.Time{}
	got.Seen, want.Seen = nil, nil
	want.Skipped = ""
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, want)
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Serializer.Marshal(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 20, 2000} {
		want := makeDoc(uint64(n+1), n)
		b := mustMarshal(t, &want)
		if b[0] != msgpack.Marker {
			t.Fatalf("payload begins 0x%02x", b[0])
		}
		var got Doc
		if err := msgpack.Serializer.Unmarshal(b, &got); err != nil {
			t.Fatalf("%d items: %v", n, err)
		}
		equalDoc(t, got, want)
	}
	// Marshal appends, and Unmarshal reads what it appended.
	b, err := msgpack.Serializer.Marshal([]byte("prefix"), map[string]int{"a": 1})
	if err != nil || !bytes.HasPrefix(b, []byte("prefix\xc1")) {
		t.Fatalf("Marshal after a prefix: %q, %v", b, err)
	}
	var m map[string]int
	if err := msgpack.Serializer.Unmarshal(b[len("prefix"):], &m); err != nil || m["a"] != 1 {
		t.Fatalf("Unmarshal: %v, %v", m, err)
	}
	// Scalars, and values decoded into interfaces.
	for _, v := range []any{nil, true, 0, 1, 49, -1, 200, 1 << 40, -1 << 40, 3.25, "", "héllo", []any{"a", int64(1)}} {
		b := mustMarshal(t, v)
		var got any
		if err := msgpack.Serializer.Unmarshal(b, &got); err != nil {
			t.Fatalf("%v: %v", v, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("%v (%T): got %v (%T)", v, v, got, got)
		}
	}
	if msgpack.Serializer.Text() {
		t.Error("Text() is true: binary values would be stored without a header")
	}
}

// TestUnmarshalDoesNotRetain overwrites the payload after decoding: the
// decoded value must not change, as the cache reuses its buffer.
func TestUnmarshalDoesNotRetain(t *testing.T) {
	want := makeDoc(5, 50)
	b := mustMarshal(t, &want)
	var got Doc
	if err := msgpack.Serializer.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var raw vmsgpack.RawMessage
	if err := msgpack.Serializer.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	rawCopy := bytes.Clone(raw)
	for i := range b {
		b[i] = 0xff
	}
	equalDoc(t, got, want)
	if !bytes.Equal(raw, rawCopy) {
		t.Error("a RawMessage kept a reference to the payload")
	}
}

// TestWhyTheMarker shows the accident the marker rules out: a bare
// MessagePack value can be JSON text meaning something else.
func TestWhyTheMarker(t *testing.T) {
	bare, err := vmsgpack.Marshal(49) // the positive fixint 0x31
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := json.Unmarshal(bare, &n); err != nil || n != 1 {
		t.Fatalf("bare MessagePack 49 as JSON: %d, %v; expected the accident, 1", n, err)
	}
	marked := mustMarshal(t, 49)
	for _, s := range []packcache.Serializer{packcache.JSON, stdJSON{}} {
		if err := s.Unmarshal(marked, &n); err == nil {
			t.Errorf("JSON serializer read the marked value as %d", n)
		}
	}
}

// TestRefusesUnmarked checks that a payload without the marker, valid
// MessagePack or JSON, is refused with ErrNotMsgpack.
func TestRefusesUnmarked(t *testing.T) {
	doc := makeDoc(3, 10)
	bare, err := vmsgpack.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(&doc)
	for name, p := range map[string][]byte{
		"msgpack without the marker":   bare,
		"fixint 1, without the marker": {0x01},
		"JSON document":                js,
		"JSON number":                  []byte("1"),
		"empty":                        nil,
	} {
		var got Doc
		err := msgpack.Serializer.Unmarshal(p, &got)
		if !errors.Is(err, msgpack.ErrNotMsgpack) {
			t.Errorf("%s: %v, want ErrNotMsgpack", name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "not a msgpack value") {
			t.Errorf("%s: message %q does not say it is not a msgpack value", name, err)
		}
	}
}

// allocated returns how many bytes f allocated on the heap.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostile decodes payloads that declare far more than they hold. The
// library preallocates what an array or binary header declares (measured
// here for the record), so Unmarshal refuses them before decoding, having
// allocated next to nothing.
func TestHostile(t *testing.T) {
	deep := append([]byte{msgpack.Marker}, bytes.Repeat([]byte{0x91}, msgpack.MaxDepth+1)...)
	deep = append(deep, 0x00)
	okDeep := append([]byte{msgpack.Marker}, bytes.Repeat([]byte{0x91}, 100)...)
	okDeep = append(okDeep, 0x00)
	tests := []struct {
		name    string
		payload []byte
		into    func() any
	}{
		{"array32 of 256Ki messages, 0 present", []byte{0xc1, 0xdd, 0x00, 0x04, 0x00, 0x00}, func() any { return new([]Doc) }},
		{"array32 of 4Gi", []byte{0xc1, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}, func() any { return new([]int64) }},
		{"bin32 of 64 MiB", []byte{0xc1, 0xc6, 0x04, 0x00, 0x00, 0x00, 'x'}, func() any { return new([]byte) }},
		{"str32 of 4 GiB", []byte{0xc1, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}, func() any { return new(string) }},
		{"map32 of 1Gi entries", []byte{0xc1, 0xdf, 0x40, 0x00, 0x00, 0x00, 0xa1, 'k', 0x01}, func() any { return new(map[string]int) }},
		{"ext32 of 4 GiB", []byte{0xc1, 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, func() any { return new(any) }},
		{"map of 2 entries, 1 present", []byte{0xc1, 0x82, 0xa1, 'k', 0x01}, func() any { return new(map[string]int) }},
		{"nested deeper than MaxDepth", deep, func() any { return new(any) }},
		{"trailing byte", []byte{0xc1, 0x01, 0x02}, func() any { return new(int) }},
		{"two values", append(mustMarshal(t, "a"), mustMarshal(t, "a")[1:]...), func() any { return new(string) }},
		{"marker only", []byte{0xc1}, func() any { return new(int) }},
		{"0xc1 inside", []byte{0xc1, 0x92, 0x01, 0xc1}, func() any { return new([]int) }},
		{"truncated uint64", []byte{0xc1, 0xcf, 0x00, 0x00}, func() any { return new(uint64) }},
		{"truncated str8 length", []byte{0xc1, 0xd9}, func() any { return new(string) }},
	}
	for _, tt := range tests {
		var err error
		got := allocated(func() { err = msgpack.Serializer.Unmarshal(tt.payload, tt.into()) })
		if !errors.Is(err, msgpack.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tt.name, err)
		}
		bound := uint64(16 << 10)
		if tt.name == "nested deeper than MaxDepth" {
			// check's stack: 4 bytes a level, doubled up to 16Ki
			// levels, 128 KiB in all; the race detector adds its own.
			bound = 256 << 10
		}
		if got > bound {
			t.Errorf("%s: allocated %d bytes refusing it, bound %d", tt.name, got, bound)
		}
	}
	// What the library alone allocates for the first of them.
	lib := allocated(func() { _ = vmsgpack.Unmarshal(tests[0].payload[1:], new([]Doc)) })
	t.Logf("vmihailenco/msgpack Unmarshal of a 5-byte array32 header claiming 256Ki Docs: allocated %d bytes", lib)

	// Nesting up to the limit is fine.
	atLimit := append([]byte{msgpack.Marker}, bytes.Repeat([]byte{0x91}, msgpack.MaxDepth)...)
	atLimit = append(atLimit, 0x00)
	for name, p := range map[string][]byte{"100 levels": okDeep, "MaxDepth levels": atLimit} {
		var v any
		if err := msgpack.Serializer.Unmarshal(p, &v); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	// Every prefix of a value is refused: MessagePack is prefix-free.
	doc := makeDoc(9, 30)
	full := mustMarshal(t, &doc)
	for n := 1; n < len(full); n++ {
		var got Doc
		if err := msgpack.Serializer.Unmarshal(full[:n], &got); !errors.Is(err, msgpack.ErrInvalid) {
			t.Fatalf("prefix of %d of %d bytes: %v, want ErrInvalid", n, len(full), err)
		}
	}

	// Random bytes after the marker never panic.
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		p := make([]byte, 1+r.IntN(64))
		p[0] = msgpack.Marker
		for j := 1; j < len(p); j++ {
			p[j] = byte(r.Uint32())
		}
		var d Doc
		_ = msgpack.Serializer.Unmarshal(p, &d)
		var a any
		_ = msgpack.Serializer.Unmarshal(p, &a)
		_ = i
	}
}

// FuzzUnmarshal decodes any payload into a Doc and into an interface
// value: no panic, and any payload the check accepts is one value to the
// library too, ending where the payload ends.
func FuzzUnmarshal(f *testing.F) {
	d := makeDoc(1, 3)
	f.Add(mustMarshal(f, &d))
	f.Add(mustMarshal(f, map[string]any{"a": []any{1, "b", nil}}))
	f.Add([]byte{0xc1, 0xdd, 0x00, 0x04, 0x00, 0x00})
	f.Add([]byte{0xc1, 0xc0})
	f.Fuzz(func(t *testing.T, p []byte) {
		var doc Doc
		_ = msgpack.Serializer.Unmarshal(p, &doc)
		var v any
		_ = msgpack.Serializer.Unmarshal(p, &v)
		// Where the check sees exactly one value, the library's idea of
		// that value's extent is the same.
		var raw vmsgpack.RawMessage
		// (A top-level nil decodes to a nil RawMessage.)
		if err := msgpack.Serializer.Unmarshal(p, &raw); err == nil && !bytes.Equal(raw, p[1:]) && !bytes.Equal(p, []byte{0xc1, 0xc0}) {
			t.Fatalf("accepted %x, but the library's value is %x", p[1:], raw)
		}
	})
}

func TestConcurrent(t *testing.T) {
	docs := []Doc{makeDoc(1, 0), makeDoc(2, 10), makeDoc(3, 300)}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				want := docs[(g+i)%len(docs)]
				b, err := msgpack.Serializer.Marshal(nil, &want)
				if err != nil {
					t.Error(err)
					return
				}
				var got Doc
				if err := msgpack.Serializer.Unmarshal(b, &got); err != nil {
					t.Error(err)
					return
				}
				if got.ID != want.ID || len(got.Items) != len(want.Items) {
					t.Errorf("goroutine %d: got doc %d with %d items", g, got.ID, len(got.Items))
					return
				}
			}
		})
	}
	wg.Wait()
}
