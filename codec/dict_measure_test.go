package codec

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sizeClass is what values of one size class, 10 bytes wide, stored.
type sizeClass struct {
	values, plain, dict, zstd, shrank int
}

// storedBySize writes every value of test with d's fastest codec and with
// Zstd, counting stored bytes with the header byte, by size class.
func storedBySize(t testing.TB, test [][]byte, d *Dictionary) map[int]*sizeClass {
	classes := map[int]*sizeClass{}
	for _, v := range test {
		c := classes[len(v)/10*10]
		if c == nil {
			c = &sizeClass{}
			classes[len(v)/10*10] = c
		}
		stored := mustAppendValue(t, d.Codec(1), v)
		c.values++
		c.plain += len(v)
		c.dict += len(stored)
		c.zstd += len(mustAppendValue(t, Zstd, v))
		if len(stored) < len(v) {
			c.shrank++
		}
	}
	return classes
}

// breakEven returns the least size from which, in every size class with
// values, compressing stored fewer bytes than plain in all, with the
// dictionary and with Zstd alone; -1 if not even the largest class did.
func breakEven(classes map[int]*sizeClass) (dict, zstd int) {
	sizes := sortedSizes(classes)
	dict, zstd = -1, -1
	dictOK, zstdOK := true, true
	for _, s := range slices.Backward(sizes) {
		c := classes[s]
		if dictOK = dictOK && c.dict < c.plain; dictOK {
			dict = s
		}
		if zstdOK = zstdOK && c.zstd < c.plain; zstdOK {
			zstd = s
		}
	}
	return dict, zstd
}

func sortedSizes(classes map[int]*sizeClass) []int {
	sizes := make([]int, 0, len(classes))
	for s := range classes {
		sizes = append(sizes, s)
	}
	slices.Sort(sizes)
	return sizes
}

func logClasses(t *testing.T, classes map[int]*sizeClass) {
	t.Log("size     values  dict   zstd   shrank with dict")
	for _, s := range sortedSizes(classes) {
		c := classes[s]
		t.Logf("%3d-%3d  %5d   %.3f  %.3f  %3.0f%%", s, s+9, c.values,
			float64(c.dict)/float64(c.plain), float64(c.zstd)/float64(c.plain), 100*float64(c.shrank)/float64(c.values))
	}
}

// TestDictionaryBreakEven measures where zstd with a dictionary starts to
// store fewer bytes than plain, which DictionaryCompressAbove documents:
// profile and session records of 30 to 400 bytes, a 4 KiB dictionary
// trained on 500 of them, the other 2,500 stored with its fastest codec
// and counted by size class, header byte included. Run it with -v for
// the table:
//
//	go test -run TestDictionaryBreakEven -v ./codec
func TestDictionaryBreakEven(t *testing.T) {
	records := smallRecords(3000, 81, 30, 400)
	d := trainedDictionary(t, records[:500], 4<<10)
	classes := storedBySize(t, records[500:], d)
	logClasses(t, classes)
	dict, zstd := breakEven(classes)
	t.Logf("break-even: %d bytes with the dictionary, %d with zstd alone", dict, zstd)
	if dict < 0 || dict > DictionaryCompressAbove {
		t.Errorf("break-even with the dictionary at %d bytes, over DictionaryCompressAbove (%d)", dict, DictionaryCompressAbove)
	}
	for s, c := range classes {
		if s > DictionaryCompressAbove && c.dict >= c.plain {
			t.Errorf("values of %d-%d bytes, above DictionaryCompressAbove, stored %d bytes of %d plain", s, s+9, c.dict, c.plain)
		}
	}
}

// TestDictionaryCorpus measures dictionaries on the shared corpus of
// public JSON documents, when it is beside the repository (it is never
// copied into it): of each document, the distinct objects and arrays of
// 40 to 400 bytes (compacted), the largest at each place, odd ones for
// training and even ones for the test. It checks nothing but logs, for
// each document, the stored ratio with a 4 KiB dictionary and with zstd
// alone and both break-evens:
//
//	go test -run TestDictionaryCorpus -v ./codec
func TestDictionaryCorpus(t *testing.T) {
	dir := corpusDir()
	if dir == "" {
		t.Skip("no JSON corpus; set PACKCACHE_CORPUS")
	}
	if testing.Short() || raceEnabled {
		t.Skip("a measurement, not a check: slow under -short and -race")
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, name := range names {
		doc, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		var frags [][]byte
		seen := map[string]bool{}
		jsonFragments(t, doc, 40, 400, &frags, seen)
		var train, test [][]byte
		for i, f := range frags {
			if i%2 == 1 {
				train = append(train, f)
			} else if len(test) < 3000 {
				test = append(test, f)
			}
		}
		if len(train) > 1000 {
			train = train[:1000]
		}
		b, err := TrainDictionary(train, 4<<10)
		if err != nil {
			t.Logf("%s: %d fragments: %v", filepath.Base(name), len(frags), err)
			continue
		}
		d, err := ParseDictionary(b)
		if err != nil {
			t.Fatal(err)
		}
		classes := storedBySize(t, test, d)
		var all sizeClass
		for _, c := range classes {
			all.values += c.values
			all.plain += c.plain
			all.dict += c.dict
			all.zstd += c.zstd
			all.shrank += c.shrank
		}
		be, bz := breakEven(classes)
		t.Logf("%-18s %5d values, median %3d B: dict %.3fx, zstd %.3fx, %3.0f%% shrank; break-even %3d B with the dictionary, %3d without",
			filepath.Base(name), all.values, medianLen(test), float64(all.dict)/float64(all.plain), float64(all.zstd)/float64(all.plain),
			100*float64(all.shrank)/float64(all.values), be, bz)
	}
}

// jsonFragments appends to out the distinct objects and arrays of raw,
// compacted, of lo to hi bytes, descending only into larger ones, keys in
// sorted order so that the result is deterministic.
func jsonFragments(t *testing.T, raw []byte, lo, hi int, out *[][]byte, seen map[string]bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '{' && raw[0] != '[') {
		return
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		t.Fatal(err)
	}
	if n := c.Len(); n < lo {
		return
	} else if n <= hi {
		if !seen[c.String()] {
			seen[c.String()] = true
			*out = append(*out, c.Bytes())
		}
		return
	}
	if raw[0] == '[' {
		var a []json.RawMessage
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatal(err)
		}
		for _, v := range a {
			jsonFragments(t, v, lo, hi, out, seen)
		}
		return
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, strings.Compare)
	for _, k := range keys {
		jsonFragments(t, m[k], lo, hi, out, seen)
	}
}

func medianLen(vs [][]byte) int {
	if len(vs) == 0 {
		return 0
	}
	n := make([]int, len(vs))
	for i, v := range vs {
		n[i] = len(v)
	}
	slices.Sort(n)
	return n[len(n)/2]
}
