package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/packcache/packcache/codec"
)

func newStatsCmd(cf *connFlags) *cobra.Command {
	var o statsOptions
	cmd := &cobra.Command{
		Use:   "stats [--prefix P]... [--sample N]",
		Short: "Report what key prefixes hold: keys, bytes, codec mix, TTLs",
		Long: `stats scans the keys under each --prefix (SCAN with MATCH, never KEYS; every master
of a cluster) and reports per prefix: keys, stored bytes, decoded bytes (estimated by
decoding a sample of up to --sample values and scaling), Redis memory (MEMORY USAGE of
the sample, scaled), the codec mix, the share stored plain, and the spread of the
remaining TTLs. Without --prefix it groups keys by their leading segment up to ':'.

Keys under packcache:dict: are packcache's own, zstd dictionaries published for the
values written with them (FORMAT.md section 3.6): they are counted apart, as
"dictionary" in the codec mix, never as plain values, and the sampled ones are checked
as readers check them.

--count is the COUNT hint of each SCAN (default 1000); --json prints the report as
JSON; --progress draws progress on stderr even when it is not a terminal.

It only reads: SCAN, STRLEN, GETRANGE, PTTL, GET, MEMORY USAGE and INFO.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.sample < 0 || o.count <= 0 {
				return usagef("--sample must be 0 or more and --count positive")
			}
			c, err := cf.connect(cmd.Context(), "", cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			o.progress = showProgress(o.progressFlag, cmd.ErrOrStderr())
			groups, err := collectStats(cmd.Context(), c, o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if o.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(groups)
			}
			printStats(cmd.OutOrStdout(), groups)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&o.prefixes, "prefix", nil, "key prefix to report on (repeatable); without it keys are grouped by their leading segment up to ':'")
	fs.IntVar(&o.sample, "sample", 100, "values to decode per prefix to estimate decoded size and memory")
	o.scanFlags.register(cmd, 1000)
	fs.BoolVar(&o.asJSON, "json", false, "print a machine-readable report")
	return cmd
}

type statsOptions struct {
	scanFlags
	prefixes []string
	sample   int
	asJSON   bool
}

// Limits on what stats keeps in memory however many keys it scans.
const (
	maxGroups  = 200    // groups by leading segment; the rest go to "(other)"
	ttlSamples = 20_000 // TTLs kept per group for the percentiles
)

// group is what stats reports for one prefix, and its --json form.
type group struct {
	Prefix      string `json:"prefix"`
	Keys        int64  `json:"keys"`        // string keys
	NotStrings  int64  `json:"not_strings"` // keys of other types, skipped
	Stored      int64  `json:"stored_bytes"`
	DecodedEst  int64  `json:"decoded_bytes_est"`
	MemoryEst   int64  `json:"memory_bytes_est"`
	Sampled     int    `json:"sampled"`
	Undecodable int    `json:"undecodable_in_sample"`
	// Dictionaries counts the keys of packcache's own, zstd dictionaries
	// (packcache:dict:<id>): not cached values, so neither plain nor
	// compressed, and never decoded.
	Dictionaries    int64      `json:"dictionaries"`
	BadDictionaries int        `json:"bad_dictionaries_in_sample"` // sampled dictionary keys readers would refuse
	Mix             []mixEntry `json:"codec_mix"`
	PlainKeys       int64      `json:"plain_keys"` // stored uncompressed: plain or 01 none
	PlainBytes      int64      `json:"plain_bytes"`
	TTL             ttlSpread  `json:"ttl"`
	Notes           []string   `json:"notes,omitempty"`

	mix     map[string]*mixEntry
	ttls    []int64
	ttlSeen int64
	sample  []sampleKey
	seen    int64 // keys offered to the sample
	values  []sampled

	memModelled bool // MEMORY USAGE failed: memory is from a model
}

type mixEntry struct {
	Codec string `json:"codec"`
	Keys  int64  `json:"keys"`
	Bytes int64  `json:"bytes"`
}

type ttlSpread struct {
	WithExpiry    int64 `json:"with_expiry"`
	WithoutExpiry int64 `json:"without_expiry"`
	MinMillis     int64 `json:"min_ms"`
	P50Millis     int64 `json:"p50_ms"`
	P90Millis     int64 `json:"p90_ms"`
	MaxMillis     int64 `json:"max_ms"`
	Exact         bool  `json:"percentiles_exact"` // false: p50 and p90 come from a uniform sample of TTLs
}

type sampleKey struct {
	key    string
	strlen int64
}

// sampled is one sampled value, read whole.
type sampled struct {
	key     string
	stored  []byte
	decoded []byte // nil unless the value decoded
	kind    kind
	mem     int64
	pttl    int64
	err     error // why it did not decode
}

// collectStats scans and samples the keys of every prefix in o (or of the
// whole keyspace, grouped by leading segment) and returns a group per
// prefix, in the order given, or by stored bytes when grouping.
func collectStats(ctx context.Context, c *conn, o statsOptions, stderr io.Writer) ([]*group, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	var groups []*group
	if len(o.prefixes) == 0 {
		gs, err := scanGroups(ctx, c, "*", o, stderr, rng, func(key string) string {
			if i := strings.IndexByte(key, ':'); i >= 0 {
				return key[:i+1]
			}
			return "(no colon)"
		})
		if err != nil {
			return nil, err
		}
		if len(gs) == 0 {
			return nil, errors.New("no keys in this database")
		}
		groups = gs
		slices.SortFunc(groups, func(a, b *group) int { return cmp.Compare(b.Stored, a.Stored) })
	} else {
		for _, p := range o.prefixes {
			gs, err := scanGroups(ctx, c, matchPattern(p), o, stderr, rng, func(string) string { return p })
			if err != nil {
				return nil, err
			}
			if len(gs) == 0 {
				return nil, fmt.Errorf("no keys under prefix %q", p)
			}
			groups = append(groups, gs...)
		}
	}
	for _, g := range groups {
		if err := sampleValues(ctx, c, g); err != nil {
			return nil, err
		}
		g.finish()
	}
	return groups, nil
}

// scanGroups scans the keys matching match and sorts them into groups by
// name, reading each key's length, first two bytes and TTL.
func scanGroups(ctx context.Context, c *conn, match string, o statsOptions, stderr io.Writer, rng *rand.Rand, name func(string) string) ([]*group, error) {
	bar := newProgress(o.progress, stderr, -1, "scanning "+match, "keys")
	defer bar.finish()
	var mu sync.Mutex
	byName := map[string]*group{}
	var order []*group
	s := newScanner(c, match, o.count, nil)
	err := s.run(ctx, func(ctx context.Context, keys []string) error {
		pipe := c.rdb.Pipeline()
		strlen := make([]*redis.IntCmd, len(keys))
		head := make([]*redis.StringCmd, len(keys))
		pttl := make([]*redis.DurationCmd, len(keys))
		for i, k := range keys {
			strlen[i] = pipe.StrLen(ctx, k)
			head[i] = pipe.GetRange(ctx, k, 0, 1)
			pttl[i] = pipe.PTTL(ctx, k)
		}
		pipe.Exec(ctx)
		mu.Lock()
		defer mu.Unlock()
		for i, k := range keys {
			n := name(k)
			g := byName[n]
			if g == nil {
				if len(byName) >= maxGroups {
					n = "(other)"
					g = byName[n]
				}
				if g == nil {
					g = &group{Prefix: n, mix: map[string]*mixEntry{}}
					byName[n] = g
					order = append(order, g)
				}
			}
			ttl := pttlMillis(pttl[i])
			if err := strlen[i].Err(); err != nil {
				if isWrongType(err) {
					g.NotStrings++
					continue
				}
				return fmt.Errorf("STRLEN %s: %w", k, err)
			}
			if ttl == -2 {
				continue // gone since SCAN returned it
			}
			g.add(k, strlen[i].Val(), []byte(head[i].Val()), ttl, o.sample, rng)
		}
		bar.add(len(keys))
		return nil
	})
	if err != nil {
		return nil, err
	}
	var gs []*group
	for _, g := range order {
		if g.Keys > 0 || g.NotStrings > 0 {
			gs = append(gs, g)
		}
	}
	return gs, nil
}

func pttlMillis(cmd *redis.DurationCmd) int64 {
	d := cmd.Val()
	if d < 0 {
		return int64(d) // -1 no expiry, -2 no key: go-redis does not scale these
	}
	return d.Milliseconds()
}

// add counts one string key, and offers it to the value sample (reservoir
// sampling, so every key is equally likely to be sampled).
func (g *group) add(key string, strlen int64, head []byte, ttl int64, sampleSize int, rng *rand.Rand) {
	g.Keys++
	g.Stored += strlen
	k := classifyKey(key, head, int(strlen))
	if k == kindDictionary {
		g.Dictionaries++
	}
	var b byte
	if len(head) > 0 {
		b = head[0]
	}
	label := mixLabel(k, b)
	m := g.mix[label]
	if m == nil {
		m = &mixEntry{Codec: label}
		g.mix[label] = m
	}
	m.Keys++
	m.Bytes += strlen
	if k == kindPlain || k == kindFramed && b == codec.HeaderNone {
		g.PlainKeys++
		g.PlainBytes += strlen
	}
	if ttl == -1 {
		g.TTL.WithoutExpiry++
	} else {
		g.TTL.WithExpiry++
		if g.TTL.WithExpiry == 1 || ttl < g.TTL.MinMillis {
			g.TTL.MinMillis = ttl
		}
		g.TTL.MaxMillis = max(g.TTL.MaxMillis, ttl)
		g.ttlSeen++
		if len(g.ttls) < ttlSamples {
			g.ttls = append(g.ttls, ttl)
		} else if j := rng.Int64N(g.ttlSeen); j < ttlSamples {
			g.ttls[j] = ttl
		}
	}
	g.seen++
	if len(g.sample) < sampleSize {
		g.sample = append(g.sample, sampleKey{key, strlen})
	} else if j := rng.Int64N(g.seen); j < int64(sampleSize) {
		g.sample[j] = sampleKey{key, strlen}
	}
}

// Reads of sampled values go in pipelines of at most this many keys and,
// as far as STRLEN said, this many bytes.
const (
	readBatchKeys  = 100
	readBatchBytes = 32 << 20
)

// sampleValues reads and decodes the group's sampled keys.
func sampleValues(ctx context.Context, c *conn, g *group) error {
	for len(g.sample) > 0 {
		n, size := 0, int64(0)
		for n < len(g.sample) && n < readBatchKeys && (n == 0 || size+g.sample[n].strlen <= readBatchBytes) {
			size += g.sample[n].strlen
			n++
		}
		batch := g.sample[:n]
		g.sample = g.sample[n:]
		pipe := c.rdb.Pipeline()
		gets := make([]*redis.StringCmd, n)
		mems := make([]*redis.IntCmd, n)
		pttls := make([]*redis.DurationCmd, n)
		for i, s := range batch {
			gets[i] = pipe.Get(ctx, s.key)
			mems[i] = pipe.MemoryUsage(ctx, s.key)
			pttls[i] = pipe.PTTL(ctx, s.key)
		}
		pipe.Exec(ctx)
		for i, s := range batch {
			v, err := gets[i].Bytes()
			switch {
			case errors.Is(err, redis.Nil), isWrongType(err):
				continue // gone or replaced since the scan
			case err != nil:
				return fmt.Errorf("GET %s: %w", s.key, err)
			}
			sv := sampled{key: s.key, stored: v, kind: classifyKey(s.key, v, len(v)), mem: mems[i].Val(), pttl: pttlMillis(pttls[i])}
			if mems[i].Err() != nil {
				// MEMORY USAGE may be renamed or denied (managed
				// Redis): model the value's allocation and the
				// key's, as measured on Redis 7.0.
				sv.mem = redisAlloc(len(v)) + redisAlloc(len(s.key)) + 40
				g.memModelled = true
			}
			switch sv.kind {
			case kindTombstone, kindLease:
			case kindDictionary:
				// Not a value: checked as readers check it.
				sv.err = checkDictionary(s.key, v).err
			default:
				sv.decoded, _, sv.err = c.decode(ctx, v)
				if sv.err != nil {
					sv.decoded = nil
				} else if sv.decoded == nil {
					sv.decoded = []byte{}
				}
			}
			g.values = append(g.values, sv)
		}
	}
	return nil
}

// finish turns the counts and the sample into the reported figures.
func (g *group) finish() {
	for _, m := range g.mix {
		g.Mix = append(g.Mix, *m)
	}
	slices.SortFunc(g.Mix, func(a, b mixEntry) int {
		return cmp.Or(cmp.Compare(b.Keys, a.Keys), strings.Compare(a.Codec, b.Codec))
	})
	ttls := sortedCopy(g.ttls)
	g.TTL.P50Millis = percentile(ttls, 50)
	g.TTL.P90Millis = percentile(ttls, 90)
	g.TTL.Exact = g.ttlSeen <= ttlSamples

	// Decoded size: exact for plain (the value itself) and none (less its
	// header byte); for compressed values, their stored bytes times the
	// decoded/stored ratio of the sampled values of the same codec, or of
	// all sampled compressed values if none of that codec was sampled.
	type sums struct{ stored, decoded int64 }
	byLabel := map[string]*sums{}
	var all sums
	var overhead, memN int64
	for _, v := range g.values {
		g.Sampled++
		if v.mem > 0 {
			overhead += v.mem - int64(len(v.stored))
			memN++
		}
		if v.decoded == nil {
			switch {
			case v.err != nil && v.kind == kindDictionary:
				g.BadDictionaries++
			case v.err != nil:
				g.Undecodable++
			}
			continue
		}
		var b byte
		if len(v.stored) > 0 {
			b = v.stored[0]
		}
		if !compressed(v.kind, b) {
			continue
		}
		l := mixLabel(v.kind, b)
		if byLabel[l] == nil {
			byLabel[l] = &sums{}
		}
		byLabel[l].stored += int64(len(v.stored))
		byLabel[l].decoded += int64(len(v.decoded))
		all.stored += int64(len(v.stored))
		all.decoded += int64(len(v.decoded))
	}
	if g.memModelled {
		g.Notes = append(g.Notes, "MEMORY USAGE failed: memory estimated from a model of Redis's allocations")
	}
	for _, m := range g.Mix {
		switch m.Codec {
		case "plain":
			g.DecodedEst += m.Bytes
		case "none":
			g.DecodedEst += m.Bytes - m.Keys
		case "tombstone", "lease", "empty", "dictionary":
		default:
			s := byLabel[m.Codec]
			if s == nil || s.stored == 0 {
				s = &all
			}
			if s.stored == 0 {
				g.DecodedEst += m.Bytes
				g.Notes = append(g.Notes, fmt.Sprintf("no %s value decoded in the sample: its %s counted at stored size", m.Codec, bytesIEC(float64(m.Bytes))))
				continue
			}
			g.DecodedEst += int64(float64(m.Bytes) * float64(s.decoded) / float64(s.stored))
		}
	}
	// Memory: the exact stored bytes plus, for every key, the sample's
	// mean of what MEMORY USAGE adds to a value's length (key, object,
	// allocator rounding). Scaling the sample's mean MEMORY USAGE by the
	// key count instead would carry all the variance of the value sizes:
	// on 2,000 chat channels of 2 to 128 KB, samples of 100 gave 49 and
	// 63 MiB for 55 MiB of values.
	if memN > 0 {
		g.MemoryEst = g.Stored + int64(float64(overhead)/float64(memN)*float64(g.Keys))
	}
}

func printStats(w io.Writer, groups []*group) {
	for i, g := range groups {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s  %s\n", g.Prefix, counted(g.Keys, "key"))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		row := func(name, format string, args ...any) {
			fmt.Fprintf(tw, "  %s\t%s\n", name, fmt.Sprintf(format, args...))
		}
		if g.NotStrings > 0 {
			row("not strings", "%s of other types, skipped", counted(g.NotStrings, "key"))
		}
		if g.Dictionaries > 0 {
			row("dictionaries", "%s: zstd dictionaries of packcache's own (%s<id>, FORMAT.md section 3.6), published for the values written with them; not cached values, never decoded", counted(g.Dictionaries, "key"), dictionaryKeyPrefix)
		}
		row("stored", "%s (%s bytes)", bytesIEC(float64(g.Stored)), count(g.Stored))
		if g.Stored > 0 && g.DecodedEst > 0 {
			row("decoded (est.)", "%s, stored/decoded %.3f, from %d sampled values", bytesIEC(float64(g.DecodedEst)), float64(g.Stored)/float64(g.DecodedEst), g.Sampled)
		}
		if g.MemoryEst > 0 {
			row("memory (est.)", "%s: stored bytes + keys x the sample's mean MEMORY USAGE overhead", bytesIEC(float64(g.MemoryEst)))
		}
		row("stored plain", "%s of keys, %s of bytes (plain JSON or 01 none)", share(float64(g.PlainKeys), float64(g.Keys)), share(float64(g.PlainBytes), float64(g.Stored)))
		var mix []string
		for _, m := range g.Mix {
			mix = append(mix, fmt.Sprintf("%s %s (%s)", m.Codec, count(m.Keys), share(float64(m.Keys), float64(g.Keys))))
		}
		row("codec mix", "%s", strings.Join(mix, ", "))
		t := g.TTL
		if t.WithExpiry > 0 {
			approx := ""
			if !t.Exact {
				approx = fmt.Sprintf(" (p50, p90 of %s sampled TTLs)", count(ttlSamples))
			}
			row("ttl", "min %s  p50 %s  p90 %s  max %s%s", ttlString(t.MinMillis), ttlString(t.P50Millis), ttlString(t.P90Millis), ttlString(t.MaxMillis), approx)
		}
		row("no expiry", "%s", counted(t.WithoutExpiry, "key"))
		if g.Undecodable > 0 {
			row("undecodable", "%d of %d sampled values (inspect them for the reason)", g.Undecodable, g.Sampled)
		}
		if g.BadDictionaries > 0 {
			row("bad dictionaries", "%d of the sampled keys under %s hold no dictionary readers accept under that name (inspect them for the reason)", g.BadDictionaries, dictionaryKeyPrefix)
		}
		for _, n := range g.Notes {
			row("note", "%s", n)
		}
		tw.Flush()
	}
}
