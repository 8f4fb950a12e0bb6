package main

// Issue 24, item 3: the command never misreads. Each test here failed on
// the command as it was before it.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

// inspect of a published dictionary says it is one, packcache's own key,
// and checks it as readers do; it used to print "header 0x37 plain: JSON
// stored verbatim" and "3933 bytes that are not JSON".
func TestInspectDictionaryKey(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		d, _ := profileDictionary(t, 11)
		other, _ := profileDictionary(t, 12)
		key := codec.DictionaryKey(d.ID())
		wrong := codec.DictionaryKey(other.ID()) // holds d: readers looking for other's id refuse it
		set(t, tg, 0, map[string][]byte{
			key:                   d.Bytes(),
			wrong:                 d.Bytes(),
			"packcache:dict:junk": d.Bytes(),
		})
		set(t, tg, time.Hour, map[string][]byte{"packcache:dict:0000ffff": []byte(`{"not":"a dictionary"}`)})
		tg.ResetStats(t)

		res := cli(t, with(tg, "inspect", key)...)
		if res.code != 0 {
			t.Fatalf("a published dictionary: exit %d, want 0", res.code)
		}
		mustContain(t, res.stdout, "zstd dictionary: a key of packcache's own, not a cached value",
			fmt.Sprintf("id %08x, verified as readers verify it", d.ID()), "no expiry",
			fmt.Sprintf("value: the dictionary's %s, not JSON", counted(int64(len(d.Bytes())), "byte")))
		for _, bad := range []string{"plain", "0x37", "bytes that are not JSON", "error"} {
			if strings.Contains(res.stdout, bad) {
				t.Errorf("inspect of a dictionary says %q", bad)
			}
		}

		res = cli(t, with(tg, "inspect", "--json", key)...)
		var reps []keyReport
		if err := json.Unmarshal([]byte(res.stdout), &reps); err != nil || len(reps) != 1 {
			t.Fatalf("--json: %v", err)
		}
		if r := reps[0]; r.Kind != "dictionary" || r.Header != "" || r.Decoded != nil || r.Error != "" || !strings.Contains(r.Dictionary, "verified") {
			t.Errorf("--json report of a dictionary: %+v", r)
		}

		// Keys readers would refuse: exit 1, each with the reason.
		res = cli(t, with(tg, "inspect", wrong, "packcache:dict:junk", "packcache:dict:0000ffff")...)
		if res.code != exitFailure {
			t.Errorf("dictionary keys readers refuse: exit %d, want %d", res.code, exitFailure)
		}
		mustContain(t, res.stdout,
			fmt.Sprintf("holds dictionary %08x, not %08x as its name says", d.ID(), other.ID()),
			"no reader looks this key up",
			"not a zstd dictionary readers accept",
			"Missing or not verified, the value is an unknown dictionary")
		if strings.Contains(res.stdout, "plain") {
			t.Error("a key under packcache:dict: called plain")
		}
		checkReadOnly(t, tg)
	})
}

// stats counts dictionaries as packcache's own keys, not as plain values,
// and checks the sampled ones.
func TestStatsDictionaryKeys(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		setProfiles(t, tg, "sd:", 20, 13)
		d, _ := profileDictionary(t, 14)
		other, _ := profileDictionary(t, 15)
		set(t, tg, 0, map[string][]byte{
			codec.DictionaryKey(d.ID()):     d.Bytes(),
			codec.DictionaryKey(other.ID()): d.Bytes(), // not what its name says
		})
		tg.ResetStats(t)

		res := cli(t, with(tg, "stats", "--prefix", "packcache:", "--json")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		var groups []group
		if err := json.Unmarshal([]byte(res.stdout), &groups); err != nil || len(groups) != 1 {
			t.Fatalf("%v: %s", err, res.stdout)
		}
		g := groups[0]
		if g.Keys != 2 || g.Dictionaries != 2 || g.PlainKeys != 0 || g.PlainBytes != 0 || len(g.Mix) != 1 || g.Mix[0].Codec != "dictionary" {
			t.Errorf("dictionaries counted as %+v, want 2 keys, 2 dictionaries, none plain, mix of dictionary only", g)
		}
		if g.DecodedEst != 0 || g.Undecodable != 0 || g.BadDictionaries != 1 {
			t.Errorf("decoded %d, undecodable %d, bad dictionaries %d: want 0, 0 and 1 (the one whose name is another id)", g.DecodedEst, g.Undecodable, g.BadDictionaries)
		}

		// Grouped by leading segment, beside the values they serve.
		res = cli(t, with(tg, "stats")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "packcache:  2 keys", "2 keys: zstd dictionaries of packcache's own", "bad dictionaries")
		if !regexp.MustCompile(`codec mix\s+dictionary 2 \(100\.0%\)`).MatchString(res.stdout) {
			t.Error("the codec mix of packcache: is not 2 dictionaries")
		}
		if regexp.MustCompile(`(?s)packcache:  2 keys.*?codec mix\s+plain`).MatchString(res.stdout) {
			t.Error("stats calls the dictionaries plain")
		}
		checkReadOnly(t, tg)
	})
}

// recompress never rewrites a dictionary: lz4hc would have shrunk this one
// into a value no reader could use as a dictionary, and every value
// written with it would have become unreadable.
func TestRecompressLeavesDictionaries(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		d, _ := profileDictionary(t, 16)
		key := codec.DictionaryKey(d.ID())
		set(t, tg, 0, map[string][]byte{key: d.Bytes()})
		if out := encode(t, codec.LZ4Level(3), d.Bytes()); len(out) >= len(d.Bytes()) {
			t.Fatalf("lz4hc 3 does not shrink the dictionary (%d to %d bytes): the test would prove nothing", len(d.Bytes()), len(out))
		}
		res := cli(t, with(tg, "recompress", "--prefix", "packcache:", "--codec", "lz4", "--level", "3", "--compress-above", "0")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "rewritten          0\n", "1 dictionary (packcache's own key, never rewritten)")
		if !bytes.Equal(get(t, tg, key), d.Bytes()) {
			t.Error("recompress rewrote the dictionary")
		}
	})
}

// advise --train says that half its sample trained the dictionary, and
// names what it did not measure and why.
func TestAdviseTrainReportsSamples(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain); after TestAdviseColumnsAgree, which swaps the candidates and the clock
	singleTarget(t, func(t *testing.T, tg redistest.Target) {
		setProfiles(t, tg, "at:", 100, 17)
		set(t, tg, time.Minute, map[string][]byte{
			"at:lease":     []byte("\x0c0123456789abcdef"),
			"at:tombstone": {0x0e},
			"at:user":      []byte("\x1copaque"), // a user codec nobody registered
		})
		out := filepath.Join(t.TempDir(), "at.dict")
		res := cli(t, with(tg, "advise", "--prefix", "at:", "--train", "--dictionary-out", out)...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "103 keys, 103 values sampled: 50 to train the dictionary on, 50 measured",
			"3 sampled values not measured (1 lease, 1 tombstone, 1 undecodable)",
			"trained on 50 sampled values and measured on the other 50")
		if strings.Contains(res.stdout, "53 sampled values not measured") {
			t.Error("the training half reported as not measured")
		}

		// The JSON report counts them alike.
		res = cli(t, with(tg, "advise", "--prefix", "at:", "--train", "--dictionary-out", out, "--json")...)
		var rep adviceReport
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"lease": 1, "tombstone": 1, "undecodable": 1}
		if rep.Sampled != 103 || rep.TrainedOn != 50 || rep.Measured != 50 || fmt.Sprint(rep.NotMeasured) != fmt.Sprint(want) {
			t.Errorf("sampled %d, trained on %d, measured %d, not measured %v: want 103, 50, 50, %v", rep.Sampled, rep.TrainedOn, rep.Measured, rep.NotMeasured, want)
		}
	})
}

// fakeCodec is a codec whose cost, on a fake clock, is what zstd 11's is
// on a real one, in kind: encoders kept one per GOMAXPROCS and taken in
// turn; a value an encoder meets for the first time costs it a
// millisecond (the pages of its tables touched for the first time); every
// 256th call clears its tables (256 µs; 100 ms the first time); otherwise
// a nanosecond a byte. Its format is a run-length code, to save bytes.
type fakeCodec struct {
	clock *atomic.Int64 // ns

	mu   sync.Mutex
	next int
	encs []fakeEncoder
}

type fakeEncoder struct {
	calls int
	seen  map[string]bool
}

const fakeHeader = 0x1d

func (f *fakeCodec) ID() byte     { return fakeHeader }
func (f *fakeCodec) Name() string { return "fake" }

func (f *fakeCodec) Encode(dst, src []byte) ([]byte, error) {
	f.mu.Lock()
	e := &f.encs[f.next]
	f.next = (f.next + 1) % len(f.encs)
	cost := int64(len(src))
	if !e.seen[string(src)] {
		e.seen[string(src)] = true
		cost += int64(time.Millisecond)
	}
	if e.calls++; e.calls%256 == 0 {
		cost += int64(256 * time.Microsecond)
		if e.calls == 256 {
			cost += int64(100 * time.Millisecond)
		}
	}
	f.mu.Unlock()
	f.clock.Add(cost)
	for i := 0; i < len(src); {
		j := i + 1
		for j < len(src) && j-i < 255 && src[j] == src[i] {
			j++
		}
		dst = append(dst, byte(j-i), src[i])
		i = j
	}
	return dst, nil
}

func (f *fakeCodec) Decode(dst, src []byte, limit int) ([]byte, error) {
	if len(src)%2 != 0 {
		return dst, codec.ErrCorrupt
	}
	start := len(dst)
	for i := 0; i < len(src); i += 2 {
		for range src[i] {
			dst = append(dst, src[i+1])
		}
	}
	f.clock.Add(int64(len(dst) - start))
	return dst, nil
}

var fake = &fakeCodec{clock: new(atomic.Int64)}

var registerFake = sync.OnceValue(func() error { return codec.Register(fake) })

// advise's columns agree: the sample's encode and decode speeds and the
// Get and Set µs at the median size are of the same codec, warm, so on
// values all of one size they give the same time per value, and that time
// is what the codec costs a process that has been running it. Before,
// each value was timed from its first meeting with the second encoder and
// the sample's speed was the fake's millisecond per value: 0.3 MB/s
// beside a Set µs of 1.3 (as zstd 11 showed "encode 1 MB/s" beside
// "Set µs 9.6" for 265 bytes).
func TestAdviseColumnsAgree(t *testing.T) {
	if err := registerFake(); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	fake.encs = make([]fakeEncoder, runtime.GOMAXPROCS(0))
	for i := range fake.encs {
		fake.encs[i].seen = map[string]bool{}
	}
	fake.next = 0
	fake.mu.Unlock()
	savedCands, savedClock := candidates, clock
	candidates = []choice{{name: "none", c: codec.None}, {name: "fake", c: fake}}
	clock = func() time.Duration { return time.Duration(fake.clock.Load()) }
	t.Cleanup(func() { candidates, clock = savedCands, savedClock })
	commandTiming.set()
	t.Cleanup(testTiming.set)

	for _, tg := range redistest.Targets(t) {
		if tg.Server == nil {
			continue // the timings are the command's own: one server is enough
		}
		redistest.RequireReal(t, tg.Server, "MEMORY USAGE")
		const size = 300
		kv := map[string][]byte{}
		for i := range 60 {
			v := fmt.Appendf(nil, `{"id":%06d,"pad":"`, i)
			v = append(v, bytes.Repeat([]byte("x"), size-len(v)-2)...)
			kv[fmt.Sprintf("ca:%d", i)] = append(v, `"}`...)
		}
		set(t, tg, time.Hour, kv)
		res := cli(t, with(tg, "advise", "--prefix", "ca:", "--json")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		var rep adviceReport
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		var r *result
		for _, x := range rep.Results {
			if x.Codec == "fake" {
				r = x
			}
		}
		if r == nil || r.SetUs == 0 || r.GetUs == 0 {
			t.Fatalf("no Get and Set times for the fake codec: %+v", r)
		}
		// The fake's cost per value once warm: a nanosecond a byte, and
		// a 256 µs clearing every 256 calls.
		encUs := (size + 1000.0) / 1e3
		decUs := size / 1e3
		near := func(got, want float64) bool { return got > 0.8*want && got < 1.25*want }
		t.Logf("encode %.1f MB/s (%.2f µs a value), Set %.2f µs; decode %.1f MB/s (%.2f µs a value), Get %.2f µs; the fake's costs %.2f and %.2f µs",
			r.EncMBs, size/r.EncMBs, r.SetUs, r.DecMBs, size/r.DecMBs, r.GetUs, encUs, decUs)
		if !near(size/r.EncMBs, r.SetUs) || !near(size/r.DecMBs, r.GetUs) {
			t.Errorf("the columns disagree on values all of %d bytes: encode %.1f MB/s is %.2f µs a value beside Set %.2f µs; decode %.1f MB/s is %.2f µs beside Get %.2f µs",
				size, r.EncMBs, size/r.EncMBs, r.SetUs, r.DecMBs, size/r.DecMBs, r.GetUs)
		}
		if !near(r.SetUs, encUs) || !near(r.GetUs, decUs) {
			t.Errorf("Set %.2f µs and Get %.2f µs, where the codec warm costs %.2f and %.2f", r.SetUs, r.GetUs, encUs, decUs)
		}
	}
}

// The commands that write need their server named; the commands that
// only read say which server they read when nothing named one.
func TestWritesNeedServer(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		if tg.Server == nil {
			continue
		}
		redistest.RequireReal(t, tg.Server, "Lua scripts")
		// The default points at this test's server, so that the command
		// as it was, which fell back to it, writes here and not to a
		// server the test does not own.
		saved := defaultAddr
		defaultAddr = tg.Server.Addr()
		t.Cleanup(func() { defaultAddr = saved })
		t.Setenv(envAddr, "")
		t.Setenv(envURL, "")
		profiles := map[string][]byte{}
		for i := range 30 {
			profiles[fmt.Sprint("wn:", i)] = jsonDoc(i, 2000)
		}
		set(t, tg, time.Hour, profiles)

		for _, args := range [][]string{
			{"recompress", "--prefix", "wn:", "--codec", "zstd", "--compress-above", "0"},
			{"--cluster", "recompress", "--prefix", "wn:", "--codec", "zstd", "--compress-above", "0"},
			{"advise", "--prefix", "wn:", "--train", "--publish", "--dictionary-out", filepath.Join(t.TempDir(), "x.dict")},
			{"invalidate", "--group", "wn"},
			{"--cluster", "invalidate", "--group", "wn"},
		} {
			res := cli(t, args...)
			if res.code != exitUsage || !strings.Contains(res.stderr, "writes, so it needs its server named") {
				t.Errorf("%v without a server named: exit %d, %q; want %d and the reason", args, res.code, res.stderr, exitUsage)
			}
		}
		for k, v := range profiles {
			if !bytes.Equal(get(t, tg, k), v) {
				t.Fatalf("%s was rewritten by a command that named no server", k)
			}
		}
		if n := len(tg.Client.Keys(t.Context(), "packcache:dict:*").Val()); n != 0 {
			t.Errorf("%d dictionaries published by a command that named no server", n)
		}
		if n := tg.Client.Exists(t.Context(), groupSeqKey).Val(); n != 0 {
			t.Errorf("invalidate moved the group sequence on a server it was not told of")
		}

		// Reading: the default, said.
		res := cli(t, "stats", "--prefix", "wn:")
		if res.code != 0 || !strings.Contains(res.stderr, "reading "+tg.Server.Addr()+", the default") {
			t.Errorf("stats without a server named: exit %d, stderr %q; want 0 and which server it read", res.code, res.stderr)
		}

		// The environment names it.
		t.Setenv(envAddr, tg.Server.Addr())
		res = cli(t, "recompress", "--prefix", "wn:", "--codec", "zstd", "--compress-above", "0")
		if res.code != 0 || !strings.Contains(res.stderr, "server from $PACKCACHE_ADDR: "+tg.Server.Addr()) {
			t.Errorf("recompress with $%s: exit %d, stderr %q", envAddr, res.code, res.stderr)
		}
		if strings.Contains(res.stdout, "rewritten          0\n") {
			t.Errorf("recompress with $%s rewrote nothing", envAddr)
		}
		t.Setenv(envURL, "redis://"+tg.Server.Addr())
		if res := cli(t, "stats", "--prefix", "wn:"); res.code != exitUsage {
			t.Errorf("$%s and $%s both set: exit %d, want %d", envAddr, envURL, res.code, exitUsage)
		}
		t.Setenv(envAddr, "")
		if res := cli(t, "stats", "--prefix", "wn:"); res.code != 0 || !strings.Contains(res.stderr, "server from $PACKCACHE_URL") {
			t.Errorf("stats with $%s: exit %d, stderr %q", envURL, res.code, res.stderr)
		}
	}
}

// Every flag is explained in its command's --help text, beyond the flag
// list, and in docs/packcache.md: the subcommand's own flags in its
// section, the connection flags in "Connecting". The docs also say which
// commands write.
func TestFlagsExplained(t *testing.T) {
	var ran bool
	root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{}, &ran)
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "packcache.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := func(title string) string {
		s := string(docs)
		i := strings.Index(s, "\n## "+title+"\n")
		if i < 0 {
			t.Fatalf("docs/packcache.md has no section %q", title)
		}
		s = s[i+1:]
		if j := strings.Index(s[3:], "\n## "); j >= 0 {
			s = s[:j+3]
		}
		return s
	}
	check := func(what, text string, c *cobra.Command, local bool) {
		fs := c.LocalNonPersistentFlags()
		if !local {
			fs = c.PersistentFlags()
		}
		names := flagNames(fs.FlagUsages())
		if len(names) == 0 {
			t.Fatalf("%s: no flags found: the check would pass vacuously", what)
		}
		for _, name := range names {
			if !strings.Contains(text, "--"+name) {
				t.Errorf("%s does not explain --%s", what, name)
			}
		}
	}
	check("docs/packcache.md, Connecting,", section("Connecting"), root, false)
	for _, c := range root.Commands() {
		check(c.Name()+" --help", c.Long, c, true)
		check("docs/packcache.md, "+c.Name()+",", section(c.Name()), c, true)
	}
	intro := string(docs)[:strings.Index(string(docs), "\n## ")]
	for _, text := range []string{root.Long, intro} {
		if !strings.Contains(text, "advise --train --publish") || !strings.Contains(text, "PACKCACHE_ADDR") {
			t.Errorf("the overview does not say that advise --train --publish writes too, and how to name the server: %q", text)
		}
	}
}

// flagNames lists the flags of a flag set's usage text, but help.
func flagNames(usages string) []string {
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([\w-]+)`).FindAllStringSubmatch(usages, -1) {
		if m[1] != "help" {
			names = append(names, m[1])
		}
	}
	return names
}
