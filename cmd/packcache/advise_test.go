package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/cmd/packcache/internal/gen"
	"github.com/packcache/packcache/codec"
	"github.com/packcache/packcache/internal/redistest"
)

func TestAdviseChat(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		rng := rand.New(rand.NewPCG(1, 1))
		kv := map[string][]byte{}
		for i := range 30 {
			doc := gen.Channel(rng, i, gen.LogUniform(rng, 1<<10, 8<<10))
			kv[fmt.Sprintf("chat:room:%d", i)] = encode(t, codec.LZ4, doc)
		}
		set(t, tg, 10*time.Minute, kv)
		set(t, tg, time.Minute, map[string][]byte{"chat:lease": []byte("\x0c0123456789abcdef")})
		tg.ResetStats(t)
		chart := filepath.Join(t.TempDir(), "advice.svg")

		res := cli(t, with(tg, "advise", "--prefix", "chat:", "--sample", "100", "--chart", chart)...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		for _, c := range candidates {
			if !regexp.MustCompile(`(?m)^\s*\*?\s+` + regexp.QuoteMeta(c.String()) + `\s+\d\.\d{3}\s`).MatchString(res.stdout) {
				t.Errorf("no table row for %s", c)
			}
		}
		mustContain(t, res.stdout, "31 keys, 31 values sampled, 30 measured", "recommended:", "rule:", "reason:", "PACKCACHE_PREFIX_CHAT_CODEC=", "# TTL is not part of this advice")
		if strings.Count(res.stdout, "*") != 1 {
			t.Error("not exactly one row marked as recommended")
		}
		policy := regexp.MustCompile(`packcache\.Policy\{Codec: codec\.(None|LZ4|Snappy|LZ4Level\(\d\)|ZstdLevel\(\d+\))(, CompressAbove: (\d+|packcache\.CompressAll))?\}`)
		if !policy.MatchString(res.stdout) {
			t.Error("no packcache.Policy literal")
		}
		// Chat JSON compresses to well under half, so something other
		// than none must win under the default bounds.
		if strings.Contains(res.stdout, "recommended: none") {
			t.Error("recommended none for chat messages")
		}
		svg, err := os.ReadFile(chart)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Polylines []struct{} `xml:"polyline"`
		}
		if err := xml.Unmarshal(svg, &doc); err != nil {
			t.Fatalf("chart is not XML: %v", err)
		}
		if want := 3 * (len(candidates) - 1); len(doc.Polylines) != want {
			t.Errorf("chart has %d lines, want %d (ratio, decode and encode per codec)", len(doc.Polylines), want)
		}
		checkReadOnly(t, tg)

		// The JSON report is the report the text run printed, rendered
		// otherwise, whatever the topology: it is checked on the single
		// node only (each run of advise measures every codec).
		if tg.Cluster != nil {
			return
		}

		// The JSON report agrees with the rule: the recommended codec has
		// the least memory of those within the bounds, give or take 1%.
		res = cli(t, with(tg, "advise", "--prefix", "chat:", "--sample", "30", "--json")...)
		var rep adviceReport
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		var rec *result
		least := 1e300
		for _, r := range rep.Results {
			if r.Codec == rep.Recommended {
				rec = r
			}
			if r.GetUs <= rep.MaxGetUs && r.SetUs <= rep.MaxSetUs {
				least = min(least, r.Memory)
			}
		}
		if rep.MaxGetUs < 100 || rep.MaxSetUs < 200 {
			t.Errorf("default bounds %g and %g µs, under 100 and 200", rep.MaxGetUs, rep.MaxSetUs)
		}
		if rec == nil || rec.Memory > least*1.01 || rec.GetUs > rep.MaxGetUs || rec.SetUs > rep.MaxSetUs {
			t.Errorf("recommended %+v breaks the rule (least memory in bounds %.0f)", rec, least)
		}
	})
}

// TestAdviseTinyValues: values too small for any codec to save a byte get
// none, whatever the timings.
func TestAdviseTinyValues(t *testing.T) {
	t.Parallel() // a set of the shared servers of its own (TestMain)
	targets(t, func(t *testing.T, tg redistest.Target) {
		kv := map[string][]byte{}
		for i := range 40 {
			kv[fmt.Sprintf("tiny:%d", i)] = []byte(fmt.Sprintf(`{"n":%d}`, i))
		}
		set(t, tg, 0, kv)
		res := cli(t, with(tg, "advise", "--prefix", "tiny:")...)
		if res.code != 0 {
			t.Fatalf("exit %d", res.code)
		}
		mustContain(t, res.stdout, "recommended: none", "packcache.Policy{Codec: codec.None}", "PACKCACHE_PREFIX_TINY_CODEC=none", "never")
	})
}

func TestThresholdAndBreakEven(t *testing.T) {
	// Values of 100 bytes do not compress; values from 1000 bytes save
	// half.
	r := &result{choice: candidates[6]}
	for range 10 {
		r.vals = append(r.vals, one{size: 100, plain: 100, comp: 110})
	}
	for _, size := range []int{1000, 3000, 9000, 20000} {
		r.vals = append(r.vals, one{size: size, plain: size, comp: size / 2})
	}
	r.breakEven()
	if r.BreakEven != 1000 || r.EveryValue {
		t.Errorf("break-even %d (every value %v), want 1000", r.BreakEven, r.EveryValue)
	}
	r.threshold()
	// Storing 1000 plain gives up 500 of 16500 saved bytes (3%): over
	// 1%, so the threshold stays below 1000.
	if r.Above != 512 {
		t.Errorf("threshold %d, want 512", r.Above)
	}

	// Only large values sampled, all saving: the break-even is below
	// them, and the threshold stops at 4 KiB rather than climbing to the
	// smallest sample.
	r = &result{choice: candidates[6]}
	for _, size := range []int{70_000, 300_000, 3_000_000} {
		r.vals = append(r.vals, one{size: size, plain: size, comp: size / 5})
	}
	r.breakEven()
	r.threshold()
	if r.BreakEven != 70_000 || !r.EveryValue || r.Above != 4096 {
		t.Errorf("break-even %d (every value %v), threshold %d; want 70000, true, 4096", r.BreakEven, r.EveryValue, r.Above)
	}

	// A codec that never saves is off.
	r = &result{choice: candidates[1], vals: []one{{size: 50, plain: 50, comp: 60}}}
	r.breakEven()
	r.threshold()
	if r.BreakEven != -1 || r.Above != -1 {
		t.Errorf("break-even %d threshold %d, want -1, -1", r.BreakEven, r.Above)
	}
}

func TestRecommend(t *testing.T) {
	rs := []*result{
		{Codec: "none", Memory: 1000, Eligible: true},
		{Codec: "fast", Memory: 400, GetUs: 5, SetUs: 20, Eligible: true},
		{Codec: "small", Memory: 397, GetUs: 30, SetUs: 150, Eligible: true}, // within 1% of fast: more CPU
		{Codec: "smallest", Memory: 300, GetUs: 400, SetUs: 900},             // out of bounds
	}
	if got := recommend(rs).Codec; got != "fast" {
		t.Errorf("recommended %s, want fast", got)
	}
	rs[2].Memory = 350
	if got := recommend(rs).Codec; got != "small" {
		t.Errorf("recommended %s, want small", got)
	}
}

func TestEnvAndPolicy(t *testing.T) {
	for prefix, want := range map[string]string{
		"channel:":        "CHANNEL",
		"report:monthly:": "REPORT_MONTHLY",
		"::a--b..c::":     "A_B_C",
		"user.Profile/v2": "USER_PROFILE_V2",
		"é:x":             "X",
	} {
		if got := envName(prefix); got != want {
			t.Errorf("envName(%q) = %q, want %q", prefix, got, want)
		}
	}
	ch := func(name string, level int) choice {
		c, err := parseChoice(name, level, name == "zstd" || name == "lz4")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cases := []struct {
		t      target
		policy string
		env    []string
	}{
		{target{ch("zstd", 3), 512}, "packcache.Policy{Codec: codec.ZstdLevel(3), CompressAbove: 512}",
			[]string{"PACKCACHE_PREFIX_CHANNEL_CODEC=zstd", "PACKCACHE_PREFIX_CHANNEL_LEVEL=3", "PACKCACHE_PREFIX_CHANNEL_COMPRESS_ABOVE=512"}},
		{target{ch("lz4", 9), 0}, "packcache.Policy{Codec: codec.LZ4Level(9), CompressAbove: packcache.CompressAll}",
			[]string{"PACKCACHE_PREFIX_CHANNEL_CODEC=lz4", "PACKCACHE_PREFIX_CHANNEL_LEVEL=9", "PACKCACHE_PREFIX_CHANNEL_COMPRESS_ABOVE=0"}},
		{target{ch("lz4", 0), 2048}, "packcache.Policy{Codec: codec.LZ4, CompressAbove: 2048}",
			[]string{"PACKCACHE_PREFIX_CHANNEL_CODEC=lz4", "PACKCACHE_PREFIX_CHANNEL_LEVEL=0", "PACKCACHE_PREFIX_CHANNEL_COMPRESS_ABOVE=2048"}},
		{target{ch("snappy", 0), 1024}, "packcache.Policy{Codec: codec.Snappy, CompressAbove: 1024}",
			[]string{"PACKCACHE_PREFIX_CHANNEL_CODEC=snappy", "PACKCACHE_PREFIX_CHANNEL_COMPRESS_ABOVE=1024"}},
		{target{ch("none", 0), 1024}, "packcache.Policy{Codec: codec.None}", []string{"PACKCACHE_PREFIX_CHANNEL_CODEC=none"}},
		{target{ch("zstd", 19), never}, "packcache.Policy{Codec: codec.None}", []string{"PACKCACHE_PREFIX_CHANNEL_CODEC=none"}},
	}
	for _, c := range cases {
		if got := c.t.policyLiteral(); got != c.policy {
			t.Errorf("%v above %d: %s, want %s", c.t.choice, c.t.above, got, c.policy)
		}
		if got := c.t.envVars("channel:"); !slices.Equal(got, c.env) {
			t.Errorf("%v above %d: %v, want %v", c.t.choice, c.t.above, got, c.env)
		}
	}
	if ch("zstd", 19).c != codec.ZstdBest || ch("zstd", 3).c != codec.ZstdDefault || ch("lz4", 9).c != codec.LZ4HC {
		t.Error("levels do not map to the codec package's codecs")
	}
}

func TestRedisAlloc(t *testing.T) {
	// Checked against MEMORY USAGE of such strings on redis-server 7.0 (less
	// the 56 bytes of key and object it adds for a short key).
	for n, want := range map[int]int64{0: 8, 4: 8, 5: 16, 100: 112, 124: 128, 125: 160, 250: 256, 253: 320, 1000: 1024, 1100: 1280, 18_000: 20_480, 70_000: 81_920, 1 << 20: 1_310_720} {
		if got := redisAlloc(n); got != want {
			t.Errorf("redisAlloc(%d) = %d, want %d", n, got, want)
		}
	}
}
