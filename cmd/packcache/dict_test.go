package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/packcache/packcache/cmd/packcache/internal/gen"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// setProfiles stores n user profiles, plain JSON, under prefix0 to
// prefixN-1, and returns them by key.
func setProfiles(t *testing.T, tg redistest.Target, prefix string, n int, seed uint64) map[string][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	kv := map[string][]byte{}
	for i := range n {
		kv[fmt.Sprint(prefix, i)] = gen.Profile(rng, i)
	}
	set(t, tg, time.Hour, kv)
	return kv
}

// trainedProfiles holds the dictionaries profileDictionary trained, by
// seed: the tests on both targets ask for the same ones, and training one
// takes tens of milliseconds of CPU. Nothing changes a dictionary's bytes
// once trained.
var trainedProfiles sync.Map // uint64 -> []byte

// profileDictionary trains a dictionary on profiles other than the stored
// ones and writes it to a file. Training is done once for each seed
// (trainedProfiles).
func profileDictionary(t *testing.T, seed uint64) (*codec.Dictionary, string) {
	t.Helper()
	var b []byte
	if v, ok := trainedProfiles.Load(seed); ok {
		b = v.([]byte)
	} else {
		rng := rand.New(rand.NewPCG(seed, 4))
		var samples [][]byte
		for i := range 300 {
			samples = append(samples, gen.Profile(rng, 1e6+i))
		}
		var err error
		if b, err = codec.TrainDictionary(samples, 2<<10); err != nil {
			t.Fatal(err)
		}
		trainedProfiles.Store(seed, b)
	}
	d, err := codec.ParseDictionary(b)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "profiles.dict")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d, file
}

func TestAdviseTrain(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	singleTarget(t, func(t *testing.T, tg redistest.Target) {
		setProfiles(t, tg, "prof:", 500, 1)
		tg.ResetStats(t)
		out := filepath.Join(t.TempDir(), "trained.dict")
		res := cli(t, with(tg, "advise", "--prefix", "prof:", "--sample", "400", "--train", "--dictionary-out", out, "--json")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		var rep adviceReport
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		da := rep.Dictionary
		if da == nil {
			t.Fatal("no dictionary in the report")
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		d, err := codec.ParseDictionary(b)
		if err != nil || fmt.Sprintf("%08x", d.ID()) != da.ID || len(b) != da.Bytes || da.Bytes > 4<<10 {
			t.Fatalf("the file (%d bytes, %v) is not the dictionary reported, %+v", len(b), err, da)
		}
		if da.TrainedOn != 200 || da.MeasuredOn != 200 || rep.Measured != 200 {
			t.Errorf("trained on %d and measured on %d (report: %d), want 200 and 200", da.TrainedOn, da.MeasuredOn, rep.Measured)
		}
		t.Logf("projected memory %.0f with the dictionary (%s), %.0f without (%s)", da.MemoryWith, da.With, da.MemoryWithout, da.Without)
		if !(da.MemoryWith < 0.8*da.MemoryWithout) || !strings.Contains(da.With, "+ dict "+da.ID) {
			t.Errorf("with the dictionary %s projects %.0f, without %s %.0f: want far less with it", da.With, da.MemoryWith, da.Without, da.MemoryWithout)
		}
		if !regexp.MustCompile(`^packcache\.Policy\{Codec: codec\.ZstdLevel\([13]\), CompressAbove: (\d+|packcache\.CompressAll), Dictionary: dict\}$`).MatchString(da.Policy) {
			t.Errorf("policy %q", da.Policy)
		}
		checkReadOnly(t, tg)
		if da.Published || tg.Client.Exists(t.Context(), da.Key).Val() != 0 {
			t.Error("published without --publish")
		}

		// --publish stores it where readers look; the text says what to do.
		out2 := filepath.Join(t.TempDir(), "published.dict")
		res = cli(t, with(tg, "advise", "--prefix", "prof:", "--sample", "200", "--train", "--dictionary-out", out2, "--publish")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "+ dict ", "dictionary: ", "trained on 100 sampled values", "with it:", "without it:", "Dictionary: dict}", "// dict: the bytes of "+out2, "published as packcache:dict:")
		key := regexp.MustCompile(`published as (packcache:dict:[0-9a-f]{8})`).FindStringSubmatch(res.stdout)
		b, _ = os.ReadFile(out2)
		if key == nil || !bytes.Equal(get(t, tg, key[1]), b) || tg.Client.PTTL(t.Context(), key[1]).Val() != -1 {
			t.Errorf("Redis does not hold the dictionary written, without expiry, under %v", key)
		}

		if res := cli(t, with(tg, "advise", "--prefix", "prof:", "--publish")...); res.code != exitUsage {
			t.Errorf("--publish without --train: exit %d, want %d", res.code, exitUsage)
		}
	})
}

func TestRecompressDictionary(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		plain := setProfiles(t, tg, "rd:", 200, 2)
		d, file := profileDictionary(t, 5)
		// A value of a dictionary Redis does not hold: skipped, kept.
		lost, _ := profileDictionary(t, 6)
		orphan := encode(t, lost.Codec(1), plain["rd:0"])
		set(t, tg, time.Hour, map[string][]byte{"rd:orphan": orphan})

		res := cli(t, with(tg, "recompress", "--prefix", "rd:", "--dictionary", file)...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		over := 0 // values over the threshold, which it compresses
		for _, v := range plain {
			if len(v) > codec.DictionaryCompressAbove {
				over++
			}
		}
		mustContain(t, res.stdout, "+ dict "+fmt.Sprintf("%08x", d.ID()), "compress above 64 bytes", "published the dictionary as "+codec.DictionaryKey(d.ID()),
			fmt.Sprintf("rewritten          %d\n", over), "skipped rd:orphan: codec: value needs zstd dictionary "+fmt.Sprintf("%08x", lost.ID()))
		if got := get(t, tg, codec.DictionaryKey(d.ID())); !bytes.Equal(got, d.Bytes()) {
			t.Error("the dictionary is not published")
		}
		if !bytes.Equal(get(t, tg, "rd:orphan"), orphan) {
			t.Error("the value of a missing dictionary was changed")
		}
		for k, v := range plain {
			stored := get(t, tg, k)
			if len(v) <= codec.DictionaryCompressAbove {
				if !bytes.Equal(stored, v) {
					t.Fatalf("%s, of %d bytes, not stored plain", k, len(v))
				}
				continue
			}
			if id, ok := codec.DictionaryID(stored); !ok || id != d.ID() {
				t.Fatalf("%s not rewritten with the dictionary", k)
			}
			if back, err := codec.DecodeValueDict(nil, stored, 1<<20, d); err != nil || !bytes.Equal(back, v) {
				t.Fatalf("%s decodes to %q, %v", k, back, err)
			}
			if ttl := tg.Client.PTTL(t.Context(), k).Val(); ttl <= 0 || ttl > time.Hour {
				t.Fatalf("%s: TTL %v, want the one it had", k, ttl)
			}
		}

		// By id, from Redis, at another level: the values are rewritten
		// as that level writes them.
		res = cli(t, with(tg, "recompress", "--prefix", "rd:", "--dictionary-id", codec.DictionaryKey(d.ID()), "--level", "3")...)
		if res.code != 0 {
			t.Fatalf("--dictionary-id: exit %d", res.code)
		}
		for k, v := range plain {
			if want := encode(t, d.Codec(3), v); len(v) > codec.DictionaryCompressAbove && !bytes.Equal(get(t, tg, k), want) {
				t.Fatalf("%s is not as level 3 with the dictionary writes it", k)
			}
		}
		for _, bad := range [][]string{
			{"--dictionary", file, "--codec", "lz4"},
			{"--dictionary", file, "--dictionary-id", "58c71407"},
			{"--dictionary-id", "not hex"},
			{"--dictionary", filepath.Join(t.TempDir(), "absent")},
		} {
			if res := cli(t, with(tg, append([]string{"recompress", "--prefix", "rd:"}, bad...)...)...); res.code != exitUsage {
				t.Errorf("%v: exit %d, want %d", bad, res.code, exitUsage)
			}
		}
		if res := cli(t, with(tg, "recompress", "--prefix", "rd:", "--dictionary-id", fmt.Sprintf("%08x", lost.ID()))...); res.code != exitFailure ||
			!strings.Contains(res.stderr, "Redis does not hold "+codec.DictionaryKey(lost.ID())) {
			t.Errorf("a dictionary Redis does not hold: exit %d, %q", res.code, res.stderr)
		}
	})
}

func TestInspectDictionary(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		d, _ := profileDictionary(t, 7)
		lost, _ := profileDictionary(t, 8)
		rec := gen.Profile(rand.New(rand.NewPCG(9, 9)), 1)
		set(t, tg, 0, map[string][]byte{
			codec.DictionaryKey(d.ID()): d.Bytes(),
			"id:ok":                     encode(t, d.Codec(1), rec),
			"id:lost":                   encode(t, lost.Codec(1), rec),
		})
		tg.ResetStats(t)
		res := cli(t, with(tg, "inspect", "id:ok")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "0x05 zstd-dict", "FORMAT.md section 3.6", "dictionary  "+codec.DictionaryKey(d.ID())+" (", "fetched from Redis",
			"zstd fastest (levels 1-2) with the dictionary", "value:\n{\n  \"id\": 1,")

		res = cli(t, with(tg, "inspect", "id:lost")...)
		if res.code != exitFailure {
			t.Errorf("a value of a missing dictionary: exit %d, want %d", res.code, exitFailure)
		}
		mustContain(t, res.stdout, fmt.Sprintf("value needs zstd dictionary %08x", lost.ID()), "Redis does not hold "+codec.DictionaryKey(lost.ID()),
			"missing or refused", "kept, never deleted")

		res = cli(t, with(tg, "stats", "--prefix", "id:")...)
		mustContain(t, res.stdout, "zstd-dict")
		checkReadOnly(t, tg)
	})
}
