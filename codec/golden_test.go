package codec

import (
	"bytes"
	stdgzip "compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// The golden files are stored values in every built-in format. They were
// written once with -update and must never change: they pin the format,
// so a reader that stops decoding them is broken, even if it still reads
// what the current writers produce.
var update = flag.Bool("update", false, "rewrite testdata/golden and the seed fuzz corpus (never in normal runs)")

const goldenDir = "testdata/golden"

// goldenFiles maps each file to its SHA-256. The .json files are the
// decoded contents the .bin files must decode to.
var goldenFiles = map[string]string{
	"doc.gzip.bin":          "f829bf6847f708ffe4ac6dbb5a1a16b7a5f68e7691522feff45aeec4eb05e32a",
	"doc.json":              "4e90808aa8a911866dbff8142e40c01689d5c48e1445bc997264c0462c246f07",
	"doc.lz4.bin":           "8e6294aec56ce9e866333342250dba6dbdf0d9dda68ee6b7f973e6166b9b8825",
	"doc.lz4hc.bin":         "4243e8de653d8ecc5e411694c6185039e1a275b3919e37a15292fafd4d5f6565",
	"doc.none.bin":          "58e139c10fb8b5b4902d1b6e2f0052026cc22604c2bde96c8322c697ff241b4b",
	"doc.plain-bom.bin":     "b2659e6fffad3db9e75b75808dc2df21819e0df078610517ab2964355e5b0241",
	"doc.plain-ws.bin":      "99dab8418b804061850a12189e4e0cbf35ddd4288740eecdbc4952c73b0be367",
	"doc.plain.bin":         "4e90808aa8a911866dbff8142e40c01689d5c48e1445bc997264c0462c246f07",
	"doc.snappy.bin":        "514c89cb1ac70ec0046f47957a026ac1c576cf822b767f32c4e573a0ca500ca1",
	"doc.zstd-best.bin":     "4dda4d7c81e9db3ef2cede6d45290a23af6d5b895232204b6b1646874bec6b41",
	"doc.zstd-dict.bin":     "d5153fd915b391eba948ac8fc5a67fedf7fcd81467c48538fb84907e5dd2c251",
	"doc.zstd.bin":          "f9b126d904c3e0ad2e4190413ffac60a7056e813214a2f1578182ad77678e283",
	"empty.json":            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	"empty.lz4.bin":         "c05d231da83665dd60560fc424059d66b433774afcff4d3b053b407f057d54ba",
	"empty.none.bin":        "4bf5122f344554c53bde2ebb8cd2b7e3d1600ad631c385a5d7cce23c7785459a",
	"empty.snappy.bin":      "9b4fb24edd6d1d8830e272398263cdbf026b97392cc35387b991dc0248a628f9",
	"empty.zstd-dict.bin":   "df3c7c527217fcaaddce9306bf7a26a6db007604b9f442daf0167a600b2d890b",
	"empty.zstd.bin":        "a63d54c618c2ba92ed221a6cd589e82083e10789841fffaa8070a117d9b5f13c",
	"notfound.groups.bin":   "92cf36d5ff291d33249256ba9384f430ac3a25fa31e11e894fde8b6726e217eb",
	"record.json":           "70ad64ecf5a24febda27b00935a0fa63d96b1cc495064ec611e66e7d8f57a1f9",
	"record.zstd-dict.bin":  "c1ad300e6c5b11fb2b7f8b1e0f82122c92e400b4379968237403f4ebdf081cfd",
	"small.groups-zstd.bin": "6a079f4576c15fa72b91ca72fda427432b8c29cd3d222bcdba64b5cc4aa639aa",
	"small.groups.bin":      "f58238f908c68951415d16948856c4ef0e6493ab8a5b3eb6a6197860c7823432",
	"small.gzip.bin":        "61987bcf5cf646b2a4d8fb2d84ee6f3150953416cc97cf10f9d81ef7c848848e",
	"small.json":            "b166045dd5a66219387bca0fc7d503cbc8fce88a9830f2ef85a7dfb65cc1c222",
	"small.lz4.bin":         "7bfcb1d0ce225939772bd20b15568ea1e44c4b7130e7664083699b8606fab0c2",
	"small.lz4hc.bin":       "4fcb65588a9622123b8fccd4431fb012344389155014a961a3e9bfb7172689e6",
	"small.none.bin":        "abf22582d22af3547b8d04e5251669945b03ec42f286448f58e6fb596b9f275d",
	"small.plain-bom.bin":   "8127be6856ca5a43f81a7db98eacc207e942e5a80261934aab9724e6a627a525",
	"small.plain-ws.bin":    "754a5bbcd273fd515d7179b92ee7f1e7b0c2320ce68b17e1b4bddc82ef81e16c",
	"small.plain.bin":       "b166045dd5a66219387bca0fc7d503cbc8fce88a9830f2ef85a7dfb65cc1c222",
	"small.snappy.bin":      "e6654f75031d3420e8c2cce64c16ea9787f90d45cf36b0a38653e54749b248f0",
	"small.zstd-best.bin":   "3ccc99b671281777ea98d65c23b49de0e05db787c565e1d4718861c98a218b06",
	"small.zstd-dict.bin":   "b71c414c92a2e6ec4ee149fb397abcc7c9149baa3c116d57f08113205ff256f2",
	"small.zstd.bin":        "3ccc99b671281777ea98d65c23b49de0e05db787c565e1d4718861c98a218b06",
	"zstd.dict":             "5819f05a6f93526fc96b5dba7e2fb0194153c29bc2ce6bf1783dfa6eae628613",
}

type goldenValue struct {
	file   string // stored value
	want   string // file holding the decoded bytes; empty for the value itself
	format string // none, lz4, snappy, zstd, zstd-dict, gzip or plain
}

// goldenDictFile is the dictionary the zstd-dict golden values were
// written with. It was trained once; writeGolden reuses it.
const goldenDictFile = "zstd.dict"

// goldenDictionary parses goldenDictFile.
func goldenDictionary(t testing.TB) *Dictionary {
	t.Helper()
	d, err := ParseDictionary(readGolden(t, goldenDictFile))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var goldenSources = []string{"small", "doc"}

func goldenValues() []goldenValue {
	var vs []goldenValue
	for _, base := range goldenSources {
		json := base + ".json"
		vs = append(vs,
			goldenValue{base + ".none.bin", json, "none"},
			goldenValue{base + ".lz4.bin", json, "lz4"},
			goldenValue{base + ".lz4hc.bin", json, "lz4"},
			goldenValue{base + ".snappy.bin", json, "snappy"},
			goldenValue{base + ".zstd.bin", json, "zstd"},
			goldenValue{base + ".zstd-best.bin", json, "zstd"},
			goldenValue{base + ".gzip.bin", json, "gzip"},
			goldenValue{base + ".plain.bin", "", "plain"},
			goldenValue{base + ".plain-ws.bin", "", "plain"},
			goldenValue{base + ".plain-bom.bin", "", "plain"},
		)
	}
	for _, base := range append(goldenSources, "record", "empty") {
		vs = append(vs, goldenValue{base + ".zstd-dict.bin", base + ".json", "zstd-dict"})
	}
	return append(vs,
		goldenValue{"empty.none.bin", "empty.json", "none"},
		goldenValue{"empty.lz4.bin", "empty.json", "lz4"},
		goldenValue{"empty.snappy.bin", "empty.json", "snappy"},
		goldenValue{"empty.zstd.bin", "empty.json", "zstd"},
	)
}

func readGolden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenDecode(t *testing.T) {
	if *update {
		writeGolden(t)
	}
	d := goldenDictionary(t)
	for _, g := range goldenValues() {
		value := readGolden(t, g.file)
		want := value
		if g.want != "" {
			want = readGolden(t, g.want)
		}
		// With the dictionary, which is the same as DecodeValue for
		// every other format.
		got, err := DecodeValueDict(nil, value, len(want), d)
		if err != nil {
			t.Errorf("%s: %v", g.file, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: decoded to %d bytes, want %d", g.file, len(got), len(want))
		}
		if g.format == "plain" && !Plain(value) {
			t.Errorf("%s: not plain", g.file)
		}
	}
}

// TestGoldenPinned fails if any golden file changed, so that a change to
// them is a deliberate edit of this table too.
func TestGoldenPinned(t *testing.T) {
	entries, err := os.ReadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		seen[name] = true
		sum := fmt.Sprintf("%x", sha256.Sum256(readGolden(t, name)))
		want, ok := goldenFiles[name]
		switch {
		case !ok:
			t.Errorf("%s is not pinned: add %q: %q,", name, name, sum)
		case sum != want:
			t.Errorf("%s changed: SHA-256 %s, pinned %s", name, sum, want)
		}
	}
	for name := range goldenFiles {
		if !seen[name] {
			t.Errorf("%s is pinned but missing", name)
		}
	}
}

// TestGoldenStockDecoders reads every golden payload with the libraries'
// own decoders and no code of ours, showing each is the standard format
// FORMAT.md says it is.
func TestGoldenStockDecoders(t *testing.T) {
	zdec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zdec.Close()
	ddec, err := zstd.NewReader(nil, zstd.WithDecoderDicts(readGolden(t, goldenDictFile)))
	if err != nil {
		t.Fatal(err)
	}
	defer ddec.Close()
	for _, g := range goldenValues() {
		value := readGolden(t, g.file)
		var got []byte
		var err error
		switch g.format {
		case "none":
			if value[0] != 0x01 {
				t.Errorf("%s: header %#x", g.file, value[0])
			}
			got = value[1:]
		case "lz4":
			if value[0] != 0x02 {
				t.Errorf("%s: header %#x", g.file, value[0])
			}
			got = make([]byte, binary.LittleEndian.Uint32(value[1:5]))
			var n int
			n, err = lz4.UncompressBlock(value[5:], got)
			got = got[:n]
		case "snappy":
			if value[0] != 0x03 {
				t.Errorf("%s: header %#x", g.file, value[0])
			}
			got, err = snappy.Decode(nil, value[1:])
		case "zstd":
			if value[0] != 0x04 {
				t.Errorf("%s: header %#x", g.file, value[0])
			}
			var h zstd.Header
			if err := h.Decode(value[1:]); err != nil || !h.HasFCS {
				t.Errorf("%s: frame header %+v, %v: no content size", g.file, h, err)
			}
			got, err = zdec.DecodeAll(value[1:], nil)
		case "zstd-dict":
			if value[0] != 0x05 {
				t.Errorf("%s: header %#x", g.file, value[0])
			}
			var h zstd.Header
			if err := h.Decode(value[1:]); err != nil || !h.HasFCS || h.DictionaryID != binary.LittleEndian.Uint32(readGolden(t, goldenDictFile)[4:]) {
				t.Errorf("%s: frame header %+v, %v: no content size or another dictionary", g.file, h, err)
			}
			got, err = ddec.DecodeAll(value[1:], nil)
		case "gzip":
			var zr *stdgzip.Reader
			if zr, err = stdgzip.NewReader(bytes.NewReader(value)); err == nil {
				got, err = io.ReadAll(zr)
			}
		case "plain":
			continue
		}
		if err != nil {
			t.Errorf("%s: stock decoder: %v", g.file, err)
			continue
		}
		if want := readGolden(t, g.want); !bytes.Equal(got, want) {
			t.Errorf("%s: stock decoder gave %d bytes, want %d", g.file, len(got), len(want))
		}
	}
}

// writeGolden writes the golden files that are missing and the seed fuzz
// corpus. It never rewrites a golden file: they pin the format, and are
// written with -update once, when added: go test -run TestGoldenDecode
// -update, then pin the new files in goldenFiles. The dictionary, whose
// training is not deterministic, is reused if present.
func writeGolden(t *testing.T) {
	docs := map[string][]byte{
		"small":  []byte(`{"user":"alice","text":"hello hello hello hello"}`),
		"doc":    chatDoc(10),
		"record": smallRecords(1, 71, 250, 300)[0],
		"empty":  {},
	}
	files := map[string][]byte{}
	dictBytes, err := os.ReadFile(filepath.Join(goldenDir, goldenDictFile))
	if err != nil {
		samples := smallRecords(300, 72, 40, 400)
		r := rand.New(rand.NewPCG(73, 73))
		for i := range 100 {
			samples = append(samples, appendChatMessage(nil, r, i))
		}
		if dictBytes, err = TrainDictionary(samples, 2<<10); err != nil {
			t.Fatal(err)
		}
	}
	files[goldenDictFile] = dictBytes
	dict, err := ParseDictionary(dictBytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{"small", "doc", "record", "empty"} {
		files[base+".zstd-dict.bin"] = mustAppendValue(t, dict.Codec(1), docs[base])
	}
	files["record.json"] = docs["record"]
	for _, base := range []string{"small", "doc", "empty"} {
		doc := docs[base]
		files[base+".json"] = doc
		enc := func(c Codec) []byte { return mustAppendValue(t, c, doc) }
		files[base+".none.bin"] = enc(None)
		files[base+".lz4.bin"] = enc(LZ4)
		files[base+".snappy.bin"] = enc(Snappy)
		files[base+".zstd.bin"] = enc(Zstd)
		if base == "empty" {
			continue
		}
		files[base+".lz4hc.bin"] = enc(LZ4HC)
		files[base+".zstd-best.bin"] = enc(ZstdBest)
		var gz bytes.Buffer
		zw := stdgzip.NewWriter(&gz)
		zw.Write(doc)
		zw.Close()
		files[base+".gzip.bin"] = gz.Bytes()
		files[base+".plain.bin"] = doc
		files[base+".plain-ws.bin"] = append([]byte("\r\n\t "), doc...)
		files[base+".plain-bom.bin"] = append([]byte("\xef\xbb\xbf"), doc...)
	}
	if err := os.MkdirAll(goldenDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		path := filepath.Join(goldenDir, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Seed corpus: every golden value for the decoder, and a few inputs
	// for each codec for the round trip.
	writeCorpus := func(target, name string, args ...string) {
		dir := filepath.Join("testdata/fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		text := "go test fuzz v1\n" + strings.Join(args, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name := range files {
		if strings.HasSuffix(name, ".bin") {
			writeCorpus("FuzzDecodeValue", "golden-"+strings.TrimSuffix(name, ".bin"), fmt.Sprintf("[]byte(%q)", readGolden(t, name)))
		}
	}
	for i := range len(fuzzCodecs) {
		writeCorpus("FuzzRoundTrip", fmt.Sprintf("small-%d", i), fmt.Sprintf("[]byte(%q)", docs["small"]), fmt.Sprintf("byte(%d)", i))
	}
	writeCorpus("FuzzRoundTrip", "doc-zstd", fmt.Sprintf("[]byte(%q)", docs["doc"]), "byte(4)")
	writeCorpus("FuzzRoundTrip", "binary-lz4", fmt.Sprintf("[]byte(%q)", randomBytes(64, 1)), "byte(1)")
	t.Logf("wrote %d golden files; pin them in goldenFiles", len(files))
}
