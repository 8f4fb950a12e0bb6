package codec

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
)

var (
	lastNames = []string{"smith", "jones", "garcia", "miller", "davis", "lopez", "wilson", "anderson", "thomas", "moore", "martin", "lee", "walker", "young", "king"}
	cities    = []string{"Berlin", "Lisbon", "Austin", "Osaka", "Lagos", "Toronto", "Madrid", "Seoul", "Lyon", "Denver", "São Paulo", "Kraków"}
	langs     = []string{"en-US", "en-GB", "de-DE", "fr-FR", "pt-BR", "ja-JP", "es-ES", "pl-PL"}
	plans     = []string{"free", "pro", "team", "enterprise"}
	roles     = []string{"user", "admin", "billing", "support"}
	agents    = []string{
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/124.0",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X)",
		"okhttp/4.12.0",
	}
)

// appendProfile appends a user profile as JSON, shaped like what a service
// caches per user: ids, names, an e-mail, dates, flags and a few optional
// parts. Each optional field is there with probability p, so that records
// range from about 40 bytes (p = 0) to about 400 (p = 1).
func appendProfile(b []byte, r *rand.Rand, i int, p float64) []byte {
	first, last := users[r.IntN(len(users))], lastNames[r.IntN(len(lastNames))]
	b = fmt.Appendf(b, `{"id":%d,"username":"%s.%s%d"`, 100000+7*i+r.IntN(7), first, last, r.IntN(100))
	has := func() bool { return r.Float64() < p }
	if has() {
		b = fmt.Appendf(b, `,"email":"%s.%s@example.com","name":"%s %s"`, first, last, first, last)
	}
	if has() {
		b = fmt.Appendf(b, `,"plan":%q,"city":%q,"lang":%q`, plans[r.IntN(len(plans))], cities[r.IntN(len(cities))], langs[r.IntN(len(langs))])
	}
	if has() {
		b = fmt.Appendf(b, `,"created":"20%02d-%02d-%02dT%02d:%02d:%02dZ","verified":%t`,
			15+r.IntN(10), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(3) > 0)
	}
	if has() {
		b = fmt.Appendf(b, `,"followers":%d,"following":%d`, r.IntN(5000), r.IntN(800))
	}
	if has() {
		b = append(b, `,"bio":"`...)
		for w := range 2 + r.IntN(12) {
			if w > 0 {
				b = append(b, ' ')
			}
			b = append(b, words[r.IntN(len(words))]...)
		}
		b = append(b, '"')
	}
	if has() {
		b = fmt.Appendf(b, `,"settings":{"theme":%q,"notifications":%t,"tz":"UTC%+d"}`,
			[]string{"dark", "light", "system"}[r.IntN(3)], r.IntN(2) == 0, r.IntN(24)-11)
	}
	return append(b, '}')
}

// appendSession appends a web session as JSON: random tokens, an address,
// a user agent, times and roles; optional fields as for appendProfile.
func appendSession(b []byte, r *rand.Rand, p float64) []byte {
	b = fmt.Appendf(b, `{"sid":"%016x","user_id":%d`, r.Uint64(), 100000+r.IntN(90000))
	has := func() bool { return r.Float64() < p }
	if has() {
		b = fmt.Appendf(b, `,"csrf":"%08x","ip":"%d.%d.%d.%d"`, r.Uint32(), 10+r.IntN(200), r.IntN(256), r.IntN(256), r.IntN(256))
	}
	if has() {
		b = fmt.Appendf(b, `,"ua":%q`, agents[r.IntN(len(agents))])
	}
	if has() {
		b = fmt.Appendf(b, `,"issued":%d,"expires":%d`, 1714000000+r.IntN(1e6), 1714086400+r.IntN(1e6))
	}
	if has() {
		b = append(b, `,"roles":[`...)
		for k := range 1 + r.IntN(3) {
			if k > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, "%q", roles[k])
		}
		b = fmt.Appendf(b, `],"mfa":%t,"lang":%q`, r.IntN(2) == 0, langs[r.IntN(len(langs))])
	}
	if has() {
		b = fmt.Appendf(b, `,"cart":{"items":%d,"total":%d.%02d,"currency":"EUR"}`, r.IntN(9), r.IntN(500), r.IntN(100))
	}
	return append(b, '}')
}

// smallRecords returns n profile and session records, half of each,
// deterministic for a seed, of sizes from lo to hi bytes inclusive.
func smallRecords(n int, seed uint64, lo, hi int) [][]byte {
	r := rand.New(rand.NewPCG(seed, 17))
	var out [][]byte
	for i := 0; len(out) < n; i++ {
		p := r.Float64()
		if lo >= 150 {
			p = 0.5 + p/2 // fewer tries for the large ones
		}
		var b []byte
		if len(out)%2 == 0 {
			b = appendProfile(nil, r, i, p)
		} else {
			b = appendSession(nil, r, p)
		}
		if len(b) >= lo && len(b) <= hi {
			out = append(out, b)
		}
	}
	return out
}

// trainedDictionary trains a dictionary of size bytes on samples and
// parses it.
func trainedDictionary(t testing.TB, samples [][]byte, size int) *Dictionary {
	t.Helper()
	b, err := TrainDictionary(samples, size)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDictionary(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// testDictionaryBytes is a dictionary trained on smallRecords, trained
// once for the tests that need any dictionary.
var testDictionaryBytes = sync.OnceValue(func() []byte {
	b, err := TrainDictionary(smallRecords(500, 100, 100, 400), 4<<10)
	if err != nil {
		panic(err)
	}
	return b
})

// testDictionary parses testDictionaryBytes afresh for the calling test:
// a Dictionary keeps the encoders of every level it wrote at, tens of
// megabytes each, for as long as it is reachable, so one shared by the
// tests would hold hundreds of megabytes live past the soft memory limit
// (see TestMain) and make every later collection work for nothing.
func testDictionary() *Dictionary {
	d, err := ParseDictionary(testDictionaryBytes())
	if err != nil {
		panic(err)
	}
	return d
}

// dictionaryOf returns the dictionary c compresses with, or nil.
func dictionaryOf(c Codec) *Dictionary {
	if zc, ok := c.(*zstdCodec); ok {
		return zc.dict
	}
	return nil
}

func mustDecodeDict(t testing.TB, value []byte, limit int, d *Dictionary) []byte {
	t.Helper()
	out, err := DecodeValueDict(nil, value, limit, d)
	if err != nil {
		t.Fatalf("DecodeValueDict: %v", err)
	}
	return out
}

func TestDictionaryRoundTrip(t *testing.T) {
	d := testDictionary()
	records := smallRecords(20, 3, 40, 400)
	for level := range zstdSpeeds {
		c := d.Codec([]int{1, 3, 7, 19}[level])
		if c != &d.codecs[level] || c.ID() != HeaderZstdDict || c.Name() != "zstd-dict" {
			t.Fatalf("level %d: codec %p %#x %q", level, c, c.ID(), c.Name())
		}
		for _, size := range roundTripSizes {
			if size > 128<<10 && level > 1 {
				continue // the slow levels take seconds at 1 MiB under -race
			}
			for _, kind := range []string{"json", "random"} {
				t.Run(fmt.Sprintf("%d/%s/%d", level, kind, size), func(t *testing.T) {
					t.Parallel()
					src := chatJSON(size)
					if kind == "random" {
						src = randomBytes(size, uint64(size))
					}
					checkRoundTrip(t, c, src)
				})
			}
		}
		t.Run(fmt.Sprintf("%d/records", level), func(t *testing.T) {
			for _, rec := range records {
				checkRoundTrip(t, c, rec)
			}
		})
	}
}

// TestDictionaryFrames checks the frames the codecs write: one frame that
// records its content size, has a checksum (but when empty), and names the
// dictionary in its Dictionary_ID field, as the reference decoder and
// DictionaryID read it.
func TestDictionaryFrames(t *testing.T) {
	d := testDictionary()
	for i := range d.codecs {
		c := &d.codecs[i]
		for _, n := range []int{0, 1, 2, 100, 255, 256, 257, 1023, 1024, 1025, 5000, 200 << 10} {
			src := chatJSON(n)
			v := mustAppendValue(t, c, src)
			var h zstd.Header
			if err := h.Decode(v[1:]); err != nil {
				t.Fatal(err)
			}
			if !h.HasFCS || h.FrameContentSize != uint64(n) || h.DictionaryID != d.ID() || h.HasCheckSum != (n > 0) {
				t.Errorf("%v, %d bytes: %+v", c.level, n, h)
			}
			if id, ok := DictionaryID(v); !ok || id != d.ID() {
				t.Errorf("%v, %d bytes: DictionaryID = %d, %v", c.level, n, id, ok)
			}
		}
	}
	for _, v := range [][]byte{
		nil,
		{HeaderZstdDict},
		mustAppendValue(t, Zstd, []byte("{}")),
		{HeaderZstdDict, 0x28, 0xb5, 0x2f},
		{HeaderZstdDict, 0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0},
		append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(100, 100, 0x68), 7)...),
	} {
		if id, ok := DictionaryID(v); ok {
			t.Errorf("DictionaryID(% x) = %d, true", v, id)
		}
	}
}

// TestDictionaryStoredRatio is the measure: 1,000 records of
// 150-400 bytes, a dictionary trained on 500 of them, the other 500
// stored (header byte included) at 0.6x their plain bytes or less, and
// every one of them smaller than plain.
func TestDictionaryStoredRatio(t *testing.T) {
	records := smallRecords(1000, 1, 150, 400)
	train, test := records[:500], records[500:]
	d := trainedDictionary(t, train, 4<<10)
	var plain, dict, nodict, shrank int
	for _, rec := range test {
		v := mustAppendValue(t, d.Codec(1), rec)
		equalOrDiff(t, "round trip", mustDecodeDict(t, v, len(rec), d), rec)
		plain += len(rec)
		dict += len(v)
		nodict += len(mustAppendValue(t, Zstd, rec))
		if len(v) < len(rec) {
			shrank++
		}
	}
	ratio := float64(dict) / float64(plain)
	t.Logf("%d values, %d plain bytes: %d stored with a %d-byte dictionary (%.3fx), %d with zstd alone (%.3fx); %d shrank",
		len(test), plain, dict, len(d.b), ratio, nodict, float64(nodict)/float64(plain), shrank)
	if ratio > 0.6 {
		t.Errorf("stored at %.3fx plain, want 0.6x or less", ratio)
	}
	if shrank != len(test) {
		t.Errorf("%d of %d values shrank", shrank, len(test))
	}
}

// TestDictionaryRotation writes values with two dictionaries, as a prefix
// does across a rotation: each decodes with its own, found by its id, and
// with the other's gets a *DictionaryError naming both.
func TestDictionaryRotation(t *testing.T) {
	old := trainedDictionary(t, smallRecords(300, 11, 100, 400), 2<<10)
	cur := trainedDictionary(t, smallRecords(300, 12, 100, 400), 2<<10)
	if old.ID() == cur.ID() {
		t.Fatalf("two dictionaries share id %d", old.ID())
	}
	known := map[uint32]*Dictionary{old.ID(): old, cur.ID(): cur}
	records := smallRecords(40, 13, 40, 400)
	type stored struct {
		value []byte
		d     *Dictionary
		rec   []byte
	}
	var values []stored
	for i, rec := range records {
		d := old
		if i >= len(records)/2 {
			d = cur
		}
		values = append(values, stored{mustAppendValue(t, d.Codec(1), rec), d, rec})
	}
	for _, s := range values {
		id, ok := DictionaryID(s.value)
		if !ok || id != s.d.ID() {
			t.Fatalf("DictionaryID = %d, %v, want %d", id, ok, s.d.ID())
		}
		equalOrDiff(t, "own dictionary", mustDecodeDict(t, s.value, len(s.rec), known[id]), s.rec)
		other := old
		if s.d == old {
			other = cur
		}
		_, err := DecodeValueDict(nil, s.value, len(s.rec), other)
		var de *DictionaryError
		if !errors.As(err, &de) || de.ID != s.d.ID() || de.Given != other.ID() || !errors.Is(err, ErrUnknownDictionary) {
			t.Fatalf("with the other dictionary: %v, want a *DictionaryError naming %08x and %08x", err, s.d.ID(), other.ID())
		}
		if _, err := other.Codec(1).Decode(nil, s.value[1:], len(s.rec)); !errors.As(err, &de) || de.Given != other.ID() {
			t.Fatalf("the other dictionary's Codec: %v", err)
		}
	}
}

// TestDictionaryUnknown reads a dictionary value without its dictionary:
// the error names the dictionary, matches ErrUnknownDictionary, and is
// neither corrupt nor an unknown header, which a reader would drop or
// reload.
func TestDictionaryUnknown(t *testing.T) {
	d := testDictionary()
	rec := smallRecords(1, 5, 200, 300)[0]
	v := mustAppendValue(t, d.Codec(1), rec)
	for name, decode := range map[string]func() ([]byte, error){
		"DecodeValue":          func() ([]byte, error) { return DecodeValue([]byte("x"), v, 1000) },
		"DecodeValueDict(nil)": func() ([]byte, error) { return DecodeValueDict([]byte("x"), v, 1000, nil) },
		"Lookup":               func() ([]byte, error) { c, _ := Lookup(HeaderZstdDict); return c.Decode([]byte("x"), v[1:], 1000) },
	} {
		out, err := decode()
		var de *DictionaryError
		if !errors.As(err, &de) || de.ID != d.ID() || de.Given != 0 {
			t.Errorf("%s: %v, want a *DictionaryError naming %08x", name, err, d.ID())
		}
		if !errors.Is(err, ErrUnknownDictionary) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnknownHeader) || errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v matches the wrong sentinels", name, err)
		}
		if string(out) != "x" {
			t.Errorf("%s: dst %q, want it as it was", name, out)
		}
	}
	want := fmt.Sprintf("codec: value needs zstd dictionary %08x", d.ID())
	if _, err := DecodeValue(nil, v, 1000); err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if got := (&DictionaryError{ID: 0xabc, Given: 0x12345678}).Error(); got != "codec: value needs zstd dictionary 00000abc, given 12345678" {
		t.Errorf("message %q", got)
	}
	// Too large is too large with or without the dictionary: a reader need
	// not fetch a dictionary for a value it would refuse.
	for _, dd := range []*Dictionary{nil, d} {
		if _, err := DecodeValueDict(nil, v, len(rec)-1, dd); !errors.Is(err, ErrTooLarge) {
			t.Errorf("limit one under, dictionary %v: %v, want ErrTooLarge", dd != nil, err)
		}
	}
	// The format cannot write without a dictionary.
	c, _ := Lookup(HeaderZstdDict)
	if _, err := AppendValue(nil, c, rec); err == nil {
		t.Errorf("AppendValue with the dictionary format and no dictionary succeeded")
	}
}

// TestDictionaryFrameRules feeds HeaderZstdDict values that break the
// format's rules: each is corrupt, with or without the dictionary.
func TestDictionaryFrameRules(t *testing.T) {
	d := testDictionary()
	good := mustAppendValue(t, d.Codec(1), []byte(`{"a":1}`))
	plain := mustAppendValue(t, Zstd, []byte(`{"a":1}`))
	tests := []struct {
		name  string
		value []byte
	}{
		{"no dictionary id", append([]byte{HeaderZstdDict}, plain[1:]...)},
		{"no content size", append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(100, -1, 0x68), d.ID())...)},
		{"two frames", append(bytes.Clone(good), good[1:]...)},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"skippable frame", []byte{HeaderZstdDict, 0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0}},
		{"truncated header", good[:6]},
		{"header only", []byte{HeaderZstdDict}},
		{"size over the blocks", append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(1000, 300<<10, 0x68), d.ID())...)},
		{"id below the range", append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(100, 100, 0x68), 1<<15-1)...)},
		{"id above the range", append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(100, 100, 0x68), 1<<31)...)},
	}
	for _, tt := range tests {
		for _, dd := range []*Dictionary{nil, d} {
			if _, err := DecodeValueDict(nil, tt.value, limit1M, dd); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%s, dictionary %v: %v, want ErrCorrupt", tt.name, dd != nil, err)
			}
		}
	}
	// A Zstandard value (04) naming a dictionary stays corrupt: only 05
	// values use one.
	v04 := append([]byte{HeaderZstd}, good[1:]...)
	if _, err := DecodeValueDict(nil, v04, limit1M, d); !errors.Is(err, ErrCorrupt) {
		t.Errorf("04 frame naming a dictionary: %v, want ErrCorrupt", err)
	}
}

// withDictID returns frame, as zstdRLEFrame writes it (not single-segment,
// no Dictionary_ID), with a 4-byte Dictionary_ID field holding id.
func withDictID(frame []byte, id uint32) []byte {
	f := append(bytes.Clone(frame[:6]), 0, 0, 0, 0)
	f[4] |= 3
	binary.LittleEndian.PutUint32(f[6:], id)
	return append(f, frame[6:]...)
}

// TestDictionaryBombs repeats the zstd bomb checks on dictionary values:
// sizes are refused before allocating for them, with or without the
// dictionary, and a size that lies costs what it does without one.
func TestDictionaryBombs(t *testing.T) {
	d := testDictionary()
	const bomb = 256 << 20
	frames := []struct {
		name   string
		frame  []byte
		want   error // with the dictionary
		nodict error // without it
		bound  uint64
	}{
		{"claims 1 TB", zstdRLEFrame(1000, 1<<40, 0x68), ErrTooLarge, ErrTooLarge, smallLoss},
		{"bomb with size", zstdRLEFrame(bomb, bomb, 0x68), ErrTooLarge, ErrTooLarge, smallLoss},
		// Only decoding tells that it holds more than it says.
		{"bomb with a size that lies", zstdRLEFrame(bomb, 512<<10, 0x68), ErrCorrupt, ErrUnknownDictionary, 2*512<<10 + 512<<10},
		{"bomb without size", zstdRLEFrame(bomb, -1, 0x68), ErrCorrupt, ErrCorrupt, smallLoss},
		{"bomb without size, window 2 GiB", zstdRLEFrame(bomb, -1, 0xa8), ErrCorrupt, ErrCorrupt, smallLoss},
	}
	for _, f := range frames {
		value := append([]byte{HeaderZstdDict}, withDictID(f.frame, d.ID())...)
		checkRefusedDict(t, f.name+", without the dictionary", value, limit1M, nil, f.nodict, f.bound)
		checkRefusedDict(t, f.name, value, limit1M, d, f.want, f.bound)
	}
	// Without a limit, a size its blocks cannot hold is still refused
	// before allocating for it.
	claim := append([]byte{HeaderZstdDict}, withDictID(frames[0].frame, d.ID())...)
	checkRefusedDict(t, "claims 1 TB, no limit", claim, math.MaxInt, d, ErrCorrupt, smallLoss)
	// Within its size, the RLE frame decodes with the dictionary, whose
	// history it does not use.
	value := append([]byte{HeaderZstdDict}, withDictID(zstdRLEFrame(1<<20, 1<<20, 0x68), d.ID())...)
	if out, err := DecodeValueDict(nil, value, 1<<20, d); err != nil || len(out) != 1<<20 {
		t.Errorf("RLE frame within the limit: %d bytes, %v", len(out), err)
	}
}

// checkRefusedDict is checkRefused for DecodeValueDict with d.
func checkRefusedDict(t *testing.T, name string, value []byte, limit int, d *Dictionary, want error, bound uint64) {
	t.Helper()
	if d != nil {
		DecodeValueDict(nil, mustAppendValue(t, d.Codec(1), chatJSON(3000)), 1<<20, d) // warm its decoder
	}
	checkRefusedWith(t, name, func() error { _, err := DecodeValueDict(nil, value, limit, d); return err }, want, bound)
}

// TestDictionaryTruncatedFlipped cuts and damages dictionary values: cut,
// each is refused; damaged, none decodes to wrong bytes, as the checksum
// covers the content and the id the dictionary.
func TestDictionaryTruncatedFlipped(t *testing.T) {
	d := testDictionary()
	doc := chatDoc(4)
	v := mustAppendValue(t, d.Codec(1), doc)
	for cut := 1; cut < len(v); cut++ {
		if out, err := DecodeValueDict(nil, v[:cut], 1<<20, d); err == nil || !isSentinel(err) {
			t.Fatalf("cut to %d of %d bytes: %d bytes, %v", cut, len(v), len(out), err)
		}
	}
	for i := 1; i < len(v); i++ {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(v)
			bad[i] ^= x
			out, err := DecodeValueDict(nil, bad, 1<<20, d)
			if err != nil && !isSentinel(err) {
				t.Fatalf("byte %d ^ %#x: undocumented error %v", i, x, err)
			}
			if err == nil && !bytes.Equal(out, doc) {
				t.Fatalf("byte %d ^ %#x: decoded to wrong bytes", i, x)
			}
		}
	}
}

// TestDictionaryID checks the id against a computation of FORMAT.md's
// rule written out anew, as another language would write it, and that
// ParseDictionary writes it into the dictionary's Dictionary_ID field
// whatever the field held.
func TestDictionaryID(t *testing.T) {
	b := readGolden(t, goldenDictFile)
	sum := sha256.Sum256(b[8:])
	h := uint64(sum[0]) | uint64(sum[1])<<8 | uint64(sum[2])<<16 | uint64(sum[3])<<24
	want := uint32(32768 + h%(2147483648-32768))
	d, err := ParseDictionary(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != want || binary.LittleEndian.Uint32(b[4:8]) != want {
		t.Fatalf("ID %d, Dictionary_ID field %d, want %d", d.ID(), binary.LittleEndian.Uint32(b[4:8]), want)
	}
	if !bytes.Equal(d.Bytes(), b) {
		t.Errorf("Bytes differ from the stamped dictionary parsed")
	}
	// Another Dictionary_ID, as "zstd --train" writes a random one: the
	// same id, and Bytes with the field replaced.
	other := bytes.Clone(b)
	binary.LittleEndian.PutUint32(other[4:], 12345)
	d2, err := ParseDictionary(other)
	if err != nil || d2.ID() != want || !bytes.Equal(d2.Bytes(), b) {
		t.Errorf("with another Dictionary_ID: %v, %v", d2, err)
	}
	if binary.LittleEndian.Uint32(other[4:]) != 12345 {
		t.Errorf("ParseDictionary modified its argument")
	}
	// Bytes is a copy: changing it changes nothing of the dictionary.
	bb := d2.Bytes()
	bb[100] ^= 0xff
	if !bytes.Equal(d2.Bytes(), b) {
		t.Errorf("Bytes returned the dictionary's own slice")
	}
	if k := DictionaryKey(0x00ab12cd); k != "packcache:dict:00ab12cd" {
		t.Errorf("DictionaryKey = %q", k)
	}
	for i := range 1000 {
		if id := dictionaryID(randomBytes(64, uint64(i))); id < 1<<15 || id >= 1<<31 {
			t.Fatalf("id %d out of range", id)
		}
	}
}

// TestParseDictionaryInvalid gives ParseDictionary bytes that are not a
// dictionary it accepts: each returns an error matching
// ErrInvalidDictionary, and none panics.
func TestParseDictionaryInvalid(t *testing.T) {
	good := readGolden(t, goldenDictFile)
	bad := [][]byte{
		nil,
		{},
		[]byte(zstdDictMagic),
		[]byte("not a dictionary at all, not a dictionary at all"),
		append([]byte("\x28\xb5\x2f\xfd"), good[4:]...), // a frame's magic
		append(bytes.Clone(good), make([]byte, MaxDictionarySize)...)[:MaxDictionarySize+1],
		append([]byte(zstdDictMagic), randomBytes(1000, 1)...),
		append(bytes.Clone(good[:8]), 0xff, 0xff, 0xff, 0xff),
	}
	for cut := range 40 {
		bad = append(bad, good[:cut])
	}
	for i, b := range bad {
		if d, err := ParseDictionary(b); !errors.Is(err, ErrInvalidDictionary) {
			t.Errorf("%d (%d bytes): %v, %v, want ErrInvalidDictionary", i, len(b), d, err)
		}
	}
	// A dictionary of exactly MaxDictionarySize bytes is accepted: the
	// golden one with content added.
	full := append(bytes.Clone(good), bytes.Repeat([]byte("x"), MaxDictionarySize-len(good))...)
	if _, err := ParseDictionary(full); err != nil {
		t.Errorf("%d bytes: %v", len(full), err)
	}
}

// TestDictionaryHostile damages a dictionary as a hostile or broken
// source could: every version that parses must decode values crafted to
// name it, from the original dictionary's frames, without panicking,
// within the limit, failing only with documented errors and never
// returning wrong bytes (the frames have checksums); and the first few
// must compress and decompress values exactly.
func TestDictionaryHostile(t *testing.T) {
	good := readGolden(t, goldenDictFile)
	orig, err := ParseDictionary(good)
	if err != nil {
		t.Fatal(err)
	}
	recs := smallRecords(8, 21, 40, 400)
	recs = append(recs, chatDoc(3), nil, randomBytes(300, 2))
	var frames [][]byte
	for _, rec := range recs {
		frames = append(frames, mustAppendValue(t, orig.Codec(1), rec)[1:])
	}
	r := rand.New(rand.NewPCG(3, 3))
	parsed, tries := 0, 400
	if testing.Short() {
		tries = 50
	}
	for i := range tries {
		b := bytes.Clone(good)
		for range 1 + r.IntN(4) {
			// Mostly the entropy tables, which the first few hundred
			// bytes hold; sometimes the content.
			at := 8 + r.IntN(min(400, len(b)-8))
			if i%4 == 3 {
				at = 8 + r.IntN(len(b)-8)
			}
			b[at] ^= byte(1 + r.IntN(255))
		}
		d, err := ParseDictionary(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidDictionary) {
				t.Fatalf("%d: %v", i, err)
			}
			continue
		}
		parsed++
		for j, rec := range recs {
			// An encoder takes GOMAXPROCS tables of 256 KiB: a few
			// dozen dictionaries show as much as all of them.
			if parsed <= 32 {
				v, err := AppendValue(nil, d.Codec(1), rec)
				if err != nil {
					t.Fatalf("%d: encoding with a damaged dictionary: %v", i, err)
				}
				equalOrDiff(t, "round trip with a damaged dictionary", mustDecodeDict(t, v, len(rec), d), rec)
			}

			// The original's frame, renamed to the damaged dictionary.
			f := bytes.Clone(frames[j])
			setDictID(t, f, d.ID())
			out, err := DecodeValueDict(nil, append([]byte{HeaderZstdDict}, f...), 1<<20, d)
			if err != nil && !isSentinel(err) {
				t.Fatalf("%d: undocumented error %v", i, err)
			}
			if err == nil && !bytes.Equal(out, rec) {
				t.Fatalf("%d: a frame decoded with a damaged dictionary to wrong bytes", i)
			}
		}
	}
	t.Logf("%d of %d damaged dictionaries parsed", parsed, tries)
}

// setDictID overwrites the Dictionary_ID field of frame with id, which
// must fit it.
func setDictID(t testing.TB, frame []byte, id uint32) {
	t.Helper()
	at := 5
	if frame[4]&(1<<5) == 0 {
		at++ // Window_Descriptor
	}
	switch zstdDictIDSize(frame[4]) {
	case 4:
		binary.LittleEndian.PutUint32(frame[at:], id)
	case 2:
		if id >= 1<<16 {
			t.Skipf("id %d does not fit the frame's 2-byte field", id)
		}
		binary.LittleEndian.PutUint16(frame[at:], uint16(id))
	default:
		t.Fatalf("frame with a Dictionary_ID field of %d bytes", zstdDictIDSize(frame[4]))
	}
}

// TestTrainDictionary checks TrainDictionary's bounds and that what it
// returns is a dictionary of at most the size asked for.
func TestTrainDictionary(t *testing.T) {
	records := smallRecords(300, 31, 100, 400)
	for _, size := range []int{256, 1000, 2 << 10, 8 << 10, MaxDictionarySize} {
		b, err := TrainDictionary(records, size)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if len(b) > size {
			t.Errorf("size %d: %d bytes", size, len(b))
		}
		d, err := ParseDictionary(b)
		if err != nil || !bytes.Equal(d.b, b) {
			t.Fatalf("size %d: %v", size, err)
		}
	}
	for _, size := range []int{-1, 0, 255, MaxDictionarySize + 1} {
		if _, err := TrainDictionary(records, size); err == nil {
			t.Errorf("size %d: no error", size)
		}
	}
	few := [][]byte{records[0], records[1], records[2], records[3], []byte("short"), nil}
	if _, err := TrainDictionary(few, 4<<10); err == nil || !strings.Contains(err.Error(), "4 samples") {
		t.Errorf("4 samples of 8 bytes or more: %v", err)
	}
	if _, err := TrainDictionary(append(few, records[4]), 4<<10); err != nil {
		t.Errorf("5 samples: %v", err)
	}
	random := [][]byte{randomBytes(500, 1), randomBytes(500, 2), randomBytes(500, 3), randomBytes(500, 4), randomBytes(500, 5)}
	if _, err := TrainDictionary(random, 4<<10); err == nil {
		t.Errorf("random samples: no error")
	}
	// Only the start of a long sample counts, so a huge one costs little.
	huge := append(slices.Clone(records), chatJSON(8<<20))
	if _, err := TrainDictionary(huge, 4<<10); err != nil {
		t.Errorf("with an 8 MiB sample: %v", err)
	}
}

// TestDictionaryConcurrent shares two dictionaries' codecs between
// goroutines from their first use; with -race it checks the lazily made
// encoders and decoders.
func TestDictionaryConcurrent(t *testing.T) {
	ds := []*Dictionary{
		trainedDictionary(t, smallRecords(200, 41, 100, 400), 2<<10),
		trainedDictionary(t, smallRecords(200, 42, 100, 400), 2<<10),
	}
	srcs := append(smallRecords(6, 43, 40, 400), chatJSON(5000), randomBytes(3000, 3))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 16 {
				d := ds[(g+i)%2]
				src := srcs[(g+i)%len(srcs)]
				v, err := AppendValue(nil, d.Codec(1+g%3*3), src) // not the best level, milliseconds a value
				if err != nil {
					t.Error(err)
					return
				}
				if out, err := DecodeValueDict(nil, v, len(src), d); err != nil || !bytes.Equal(out, src) {
					t.Errorf("round trip: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestDictionaryNoAllocs checks the hot paths: encoding into a buffer with
// room, and decoding into one, allocate nothing once the encoder and
// decoder exist.
func TestDictionaryNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	d := testDictionary()
	rec := smallRecords(1, 51, 250, 300)[0]
	c := d.Codec(1)
	v := mustAppendValue(t, c, rec)
	enc := make([]byte, 0, 2*len(rec))
	dec := make([]byte, 0, len(rec)+zstdOverAlloc)
	if n := testing.AllocsPerRun(100, func() { enc, _ = AppendValue(enc[:0], c, rec) }); n != 0 {
		t.Errorf("AppendValue: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { dec, _ = DecodeValueDict(dec[:0], v, len(rec), d) }); n != 0 {
		t.Errorf("DecodeValueDict: %v allocations", n)
	}
}

// TestDictionaryReferenceZstd decodes stored payloads with the reference
// zstd command, given the dictionary as Bytes returns it ("zstd -D dict
// -d"), as FORMAT.md tells another language to; and, the other way round,
// reads values that the reference command compressed with the dictionary,
// and with one it trained itself.
func TestDictionaryReferenceZstd(t *testing.T) {
	zstdCmd, err := exec.LookPath("zstd")
	if err != nil {
		t.Skip("no zstd command on PATH: the reference decoder is not checked (install Debian's zstd package to check it)")
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(zstdCmd, args...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("zstd %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
			}
			t.Fatalf("zstd %s: %v", strings.Join(args, " "), err)
		}
		return out
	}

	d := testDictionary()
	dictFile := write("dict", d.Bytes())
	docs := append(smallRecords(4, 61, 40, 400), nil, []byte("x"), chatDoc(10), chatJSON(300<<10), randomBytes(2000, 6))
	for level := range zstdSpeeds {
		for i, doc := range docs {
			v := mustAppendValue(t, &d.codecs[level], doc)
			payload := write(fmt.Sprintf("v%d-%d.zst", level, i), v[1:]) // the value less its header byte
			got := run("-q", "-d", "-c", "-D", dictFile, payload)
			equalOrDiff(t, fmt.Sprintf("zstd -D dict -d, level %d, value %d", level, i), got, doc)
		}
	}
	// The golden values too, with the golden dictionary.
	goldenDict := write("golden.dict", readGolden(t, goldenDictFile))
	for _, g := range goldenValues() {
		if g.format == "zstd-dict" {
			payload := write(g.file+".zst", readGolden(t, g.file)[1:])
			equalOrDiff(t, "zstd -D on "+g.file, run("-q", "-d", "-c", "-D", goldenDict, payload), readGolden(t, g.want))
		}
	}
	// Compressed by the reference command with the dictionary: the frame
	// names the dictionary's Dictionary_ID, its id, and records its size.
	for i, doc := range docs[:4] {
		src := write(fmt.Sprintf("src%d.json", i), doc)
		frame := run("-q", "-c", "--no-progress", "-3", "-D", dictFile, src)
		v := append([]byte{HeaderZstdDict}, frame...)
		if id, ok := DictionaryID(v); !ok || id != d.ID() {
			t.Fatalf("reference frame names dictionary %d, %v", id, ok)
		}
		equalOrDiff(t, "reference-compressed value", mustDecodeDict(t, v, len(doc), d), doc)
	}
	// A dictionary the reference command trained: parsed, its id written
	// into it, and used both ways.
	samples := filepath.Join(dir, "samples")
	if err := os.Mkdir(samples, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, rec := range smallRecords(400, 62, 100, 400) {
		write(fmt.Sprintf("samples/%03d.json", i), rec)
	}
	trained := filepath.Join(dir, "trained.dict")
	run("-q", "--train", "--maxdict=4096", "-o", trained, "-r", samples)
	b, err := os.ReadFile(trained)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ParseDictionary(b)
	if err != nil {
		t.Fatalf("reference dictionary: %v", err)
	}
	refFile := write("trained-stamped.dict", ref.Bytes())
	rec := smallRecords(1, 63, 200, 400)[0]
	v := mustAppendValue(t, ref.Codec(1), rec)
	equalOrDiff(t, "reference dictionary, zstd -D", run("-q", "-d", "-c", "-D", refFile, write("ref.zst", v[1:])), rec)
	frame := run("-q", "-c", "-D", refFile, write("ref.json", rec))
	equalOrDiff(t, "reference dictionary, Go", mustDecodeDict(t, append([]byte{HeaderZstdDict}, frame...), len(rec), ref), rec)
}
