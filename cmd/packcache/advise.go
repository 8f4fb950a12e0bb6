package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/packcache/packcache/codec"
)

func newAdviseCmd(cf *connFlags) *cobra.Command {
	var o adviseOptions
	cmd := &cobra.Command{
		Use:   "advise --prefix P [--sample N] [--chart FILE.svg] [--train [--dict-size N] [--dictionary-out FILE] [--publish]]",
		Short: "Measure every codec on a prefix's own values and recommend a policy",
		Long: `advise samples up to --sample values under --prefix (default 200; 1000 with
--train) and, for every built-in codec and level (none; lz4 fast; lz4hc 3, 6, 9; snappy;
zstd 1, 3, 7, 11: fastest, default, better, best), measures on this machine:

  ratio         stored/plain bytes of the sample, every value compressed
  encode MB/s   the sample's decoded bytes (10^6) per second of encoding every sampled
  decode MB/s   value in turn (decoding what the codec stores), the codec warmed up
                first as a process that has been running it has it
  break-even    the smallest sampled size from which compression saves bytes
  threshold     the threshold to recommend (below)
  memory        the projected Redis memory of the prefix: MEMORY USAGE of the sample,
                each value's allocation replaced by the one for what the codec would
                store at that threshold, scaled to the key count
  Get µs        the CPU the codec adds to a Get (decode) and a Set (encode) of a value
  Set µs        of about the median size: the mean over the middle fifth of the sample
                by size, timed as the speeds are; 0 for a value the threshold stores
                plain. On values all of one size, Set µs is that size over encode MB/s;
                on mixed sizes they differ as much as the codec's cost per byte
                differs from small values to large ones.

The threshold of a codec is the largest of 0, 64, 128, ... bytes (up to 4 KiB, or the
break-even size if larger) such that storing the sampled values at or below it plain
gives up at most 1% of the bytes that compressing every value saves.

The recommendation is the codec with the smallest projected memory among those whose
Get µs is at most --max-get-us and whose Set µs is at most --max-set-us; among those
within 1% of that memory, the one adding the least CPU. none adds nothing, so it is
chosen when no codec fits the bounds or saves over 1%. --max-get-us 0, the default,
means 100 µs, or as long as 1 GB/s (about a 10 Gbit/s link) takes to carry the median
value uncompressed if that is longer; --max-set-us 0 means 200 µs, or the time at 100
MB/s: caches are read more often than written. Lower them to favour CPU, raise them to
favour memory; the line "rule:" prints the bounds used.

It prints the recommendation as a packcache.Policy literal and as environment
variables; --json prints the whole report as JSON instead. --chart FILE also writes an
SVG of ratio and speeds against value size (timing each sampled value on its own too).
--count is the COUNT hint of each SCAN; --progress draws progress on stderr even when
it is not a terminal. Leases, tombstones, undecodable values and packcache's own keys
(zstd dictionaries, packcache:dict:ID) are not measured; they keep their size in the
projection.

--train trains a zstd dictionary (FORMAT.md section 3.6) of at most --dict-size bytes
(default 4096) on half the sampled values and measures every codec, zstd 1 and 3 with
the dictionary too, on the other half, so that no projection counts a value the
dictionary learnt from. It writes the dictionary to --dictionary-out (by default ID.dict
in the working directory), prints its size, the projected memory with and without it,
and the Policy literal to use.

advise only reads, but for --train --publish, which also stores the dictionary in Redis
under packcache:dict:ID, where readers that lack it look. Like every command that
writes, it needs its server named (--addr, --url, $PACKCACHE_ADDR or $PACKCACHE_URL).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.prefix == "" {
				return usagef("--prefix must not be empty")
			}
			if o.sample <= 0 || o.count <= 0 {
				return usagef("--sample and --count must be positive")
			}
			if o.maxGetUs < 0 || o.maxSetUs < 0 {
				return usagef("--max-get-us and --max-set-us must not be negative")
			}
			switch {
			case o.publish && !o.train:
				return usagef("--publish publishes the dictionary --train trains: add --train")
			case o.train && (o.dictSize < 256 || o.dictSize > codec.MaxDictionarySize):
				return usagef("--dict-size must be from 256 to %d bytes, not %d", codec.MaxDictionarySize, o.dictSize)
			case o.train && !cmd.Flags().Changed("sample"):
				o.sample = 1000
			}
			writer := ""
			if o.publish {
				writer = "advise --publish"
			}
			c, err := cf.connect(cmd.Context(), writer, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			o.progress = showProgress(o.progressFlag, cmd.ErrOrStderr())
			return advise(cmd.Context(), c, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.prefix, "prefix", "", "key prefix to advise on (required)")
	fs.IntVar(&o.sample, "sample", 200, "values to sample (1000 with --train, unless given)")
	fs.StringVar(&o.chart, "chart", "", "write an SVG chart of ratio and speed against value size to this `file`")
	fs.Float64Var(&o.maxGetUs, "max-get-us", 0, "most CPU, in µs, a recommended codec may add to a Get at about the median size, the Get µs column (0: 100 µs, or the median value's size at 1 GB/s if longer)")
	fs.Float64Var(&o.maxSetUs, "max-set-us", 0, "most CPU, in µs, a recommended codec may add to a Set at about the median size, the Set µs column (0: 200 µs, or the median value's size at 100 MB/s if longer)")
	o.scanFlags.register(cmd, 1000)
	fs.BoolVar(&o.asJSON, "json", false, "print a machine-readable report")
	fs.BoolVar(&o.train, "train", false, "train a zstd dictionary on the sampled values, and advise with it too")
	fs.IntVar(&o.dictSize, "dict-size", 4<<10, "largest dictionary --train may write, in bytes (256 to 131072)")
	fs.StringVar(&o.dictOut, "dictionary-out", "", "`file` --train writes the dictionary to (default ID.dict)")
	fs.BoolVar(&o.publish, "publish", false, "with --train, store the trained dictionary in Redis under packcache:dict:ID, where readers find it (a write: the server must be named)")
	cmd.MarkFlagRequired("prefix")
	return cmd
}

type adviseOptions struct {
	scanFlags
	prefix   string
	sample   int
	chart    string
	maxGetUs float64
	maxSetUs float64
	asJSON   bool
	train    bool
	dictSize int
	dictOut  string
	publish  bool
}

// candidates are the codecs and levels advise measures.
var candidates = []choice{
	{name: "none", c: codec.None},
	{name: "lz4", level: 0, c: codec.LZ4},
	{name: "lz4", level: 3, c: codec.LZ4Level(3)},
	{name: "lz4", level: 6, c: codec.LZ4Level(6)},
	{name: "lz4", level: 9, c: codec.LZ4Level(9)},
	{name: "snappy", c: codec.Snappy},
	{name: "zstd", level: 1, c: codec.ZstdLevel(1)},
	{name: "zstd", level: 3, c: codec.ZstdLevel(3)},
	{name: "zstd", level: 7, c: codec.ZstdLevel(7)},
	{name: "zstd", level: 11, c: codec.ZstdLevel(11)},
}

// Timing, once the codec is warm (warm): the whole sample is encoded and
// decoded, every value in turn, for about minSampleTime, and the median
// value for about minMedianTime; for the chart, each value for about
// minOpTime. (Variables for the tests, which shorten them: see TestMain.)
var (
	minOpTime     = 200 * time.Microsecond
	minSampleTime = 20 * time.Millisecond
	minMedianTime = 20 * time.Millisecond
)

// clock is the clock of the timings, a reading in ns from any origin:
// the CPU time of the thread that calls it where the system gives it
// (cpuClock), but for tests of what advise makes of the timings.
var clock = cpuClock

// wallClock reads the wall clock, as time since the process began.
var wallClock = func() func() time.Duration {
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}()

// tieShare is how close in projected memory (and in saving, for the
// threshold) two choices must be for the cheaper one to win.
const tieShare = 0.01

// one is a codec's result on one sampled value.
type one struct {
	size  int     // decoded bytes
	plain int     // bytes stored plain: size, or size+1 when framed with 01
	comp  int     // bytes stored compressed, header included
	enc   float64 // ns per encode
	dec   float64 // ns per decode
}

// saves reports whether the compressed form would be stored.
func (v one) saves() bool { return v.comp+minSaving <= v.plain }

// result is everything advise measured and worked out for one codec.
type result struct {
	choice     choice
	vals       []one
	Codec      string  `json:"codec"`
	Policy     string  `json:"policy"`
	Ratio      float64 `json:"ratio"` // compressed/plain over the sample, every value compressed
	EncMBs     float64 `json:"encode_mb_s"`
	DecMBs     float64 `json:"decode_mb_s"`
	BreakEven  int     `json:"break_even_bytes"` // -1: never saves
	EveryValue bool    `json:"every_sampled_value_saves"`
	Above      int     `json:"threshold_bytes"` // -1: off
	Stored     float64 `json:"projected_stored_bytes"`
	Memory     float64 `json:"projected_memory_bytes"`
	GetUs      float64 `json:"get_us_at_median"` // mean over the values nearest the median in size; 0 for those stored plain
	SetUs      float64 `json:"set_us_at_median"` // the same, for a Set; 0 for those at or under the threshold
	Eligible   bool    `json:"within_bounds"`
}

type adviceReport struct {
	Prefix    string `json:"prefix"`
	Keys      int64  `json:"keys"`
	Sampled   int    `json:"sampled"`
	TrainedOn int    `json:"trained_on,omitempty"` // with --train: the sampled values the dictionary learnt from, not measured
	Measured  int    `json:"measured"`
	// NotMeasured counts the other sampled values not measured, by why:
	// lease, tombstone, dictionary (packcache's own keys) or undecodable.
	NotMeasured map[string]int `json:"not_measured,omitempty"`
	MedianBytes int            `json:"median_bytes"`
	// Get and Set µs are the mean over the values nearest the median in
	// size: BandValues of them, from BandBytes[0] to BandBytes[1] bytes.
	BandBytes   [2]int    `json:"median_band_bytes"`
	BandValues  int       `json:"median_band_values"`
	StoredNow   int64     `json:"stored_bytes_now"`
	MemoryNow   float64   `json:"memory_bytes_now_est"`
	MaxGetUs    float64   `json:"max_get_us"`
	MaxSetUs    float64   `json:"max_set_us"`
	Results     []*result `json:"codecs"`
	Recommended string    `json:"recommended"`
	Rule        string    `json:"rule"`
	Reason      string    `json:"reason"`
	Policy      string    `json:"policy"`
	Env         []string  `json:"env"`

	Dictionary *dictionaryAdvice `json:"dictionary,omitempty"` // with --train
}

func advise(ctx context.Context, c *conn, o adviseOptions, stdout, stderr io.Writer) error {
	groups, err := collectStats(ctx, c, statsOptions{prefixes: []string{o.prefix}, sample: o.sample, scanFlags: o.scanFlags}, stderr)
	if err != nil {
		return err
	}
	g := groups[0]
	if g.Keys == 0 {
		return fmt.Errorf("no string keys under prefix %q (%d keys of other types)", o.prefix, g.NotStrings)
	}
	// Values that are not data (leases, tombstones, packcache's own
	// dictionaries) or that cannot be decoded stay as they are under any
	// policy: they count in the memory projection at their current size
	// but are not measured.
	var values []sampled
	var memOther, memSample float64
	notMeasured := map[string]int{}
	for _, v := range g.values {
		memSample += float64(v.mem)
		if v.decoded == nil {
			memOther += float64(v.mem)
			notMeasured[whyNotMeasured(v)]++
			continue
		}
		values = append(values, v)
	}
	if len(values) == 0 {
		return fmt.Errorf("none of the %d sampled values under %q is a value to measure (%s)", len(g.values), o.prefix, notMeasuredList(notMeasured))
	}
	cands := candidates
	var da *dictionaryAdvice
	if o.train {
		var train []sampled
		if train, values, memOther, err = split(values, memOther); err != nil {
			return err
		}
		memSample = memOther
		for _, v := range values {
			memSample += float64(v.mem)
		}
		if da, err = trainDictionary(train, len(values), o); err != nil {
			return err
		}
		cands = append(slices.Clone(candidates), zstdChoice(1).withDictionary(da.d), zstdChoice(3).withDictionary(da.d))
	}
	sizes := make([]int64, len(values))
	for i, v := range values {
		sizes[i] = int64(len(v.decoded))
	}
	sorted := sortedCopy(sizes)
	median, band := medianBand(values)

	medianBytes := float64(len(values[median].decoded))
	if o.maxGetUs == 0 {
		o.maxGetUs = math.Round(max(100, medianBytes/1e3)) // bytes at 1 GB/s, in µs
	}
	if o.maxSetUs == 0 {
		o.maxSetUs = math.Round(max(200, medianBytes/1e2)) // bytes at 100 MB/s, in µs
	}

	bar := newProgress(o.progress, stderr, int64(len(cands)), "measuring codecs", "codecs")
	var results []*result
	for _, ch := range cands {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := measure(ch, values, band, c.limit, o.chart != "")
		if err != nil {
			return err
		}
		r.project(values, memOther, memSample, float64(g.MemoryEst))
		r.Eligible = r.GetUs <= o.maxGetUs && r.SetUs <= o.maxSetUs
		results = append(results, r)
		bar.add(1)
	}
	bar.finish()

	rep := &adviceReport{
		Prefix: o.prefix, Keys: g.Keys, Sampled: len(g.values), Measured: len(values), NotMeasured: notMeasured,
		MedianBytes: len(values[median].decoded), BandBytes: [2]int{len(values[band[0]].decoded), len(values[band[len(band)-1]].decoded)}, BandValues: len(band), StoredNow: g.Stored, MemoryNow: float64(g.MemoryEst),
		Results: results, MaxGetUs: o.maxGetUs, MaxSetUs: o.maxSetUs,
	}
	best := recommend(results)
	t := target{choice: best.choice, above: best.Above}
	if best.Above < 0 {
		t.above = never
	}
	rep.Recommended = best.Codec
	rep.Rule = fmt.Sprintf("the smallest projected memory among codecs adding at most %g µs per Get and %g µs per Set at about the median size; within %g%% of that memory, the least added CPU", o.maxGetUs, o.maxSetUs, 100*tieShare)
	rep.Reason = reason(best, results, o)
	rep.Policy = t.policyLiteral()
	rep.Env = t.envVars(o.prefix)
	if da != nil {
		if err := da.finish(ctx, c, results, o); err != nil {
			return err
		}
		rep.Dictionary = da
		rep.TrainedOn = da.TrainedOn
	}

	if o.chart != "" {
		if err := writeAdviceChart(o.chart, rep); err != nil {
			return fmt.Errorf("--chart: %w", err)
		}
	}
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printAdvice(stdout, rep, g, sorted)
	if da != nil {
		da.print(stdout)
	}
	return nil
}

// whyNotMeasured says why a sampled value that did not decode is not
// measured: lease, tombstone, dictionary or undecodable.
func whyNotMeasured(v sampled) string {
	switch v.kind {
	case kindLease:
		return "lease"
	case kindTombstone:
		return "tombstone"
	case kindDictionary:
		return "dictionary"
	}
	return "undecodable"
}

// notMeasuredList words the counts of values not measured, by reason:
// "1 lease, 2 undecodable".
func notMeasuredList(m map[string]int) string {
	var why []string
	for _, k := range []string{"lease", "tombstone", "dictionary", "undecodable"} {
		if c := m[k]; c > 0 {
			why = append(why, notMeasuredLabel(k, c))
		}
	}
	return strings.Join(why, ", ")
}

// notMeasuredLabel words n values not measured for reason why.
func notMeasuredLabel(why string, n int) string {
	switch why {
	case "lease":
		return counted(int64(n), "lease")
	case "tombstone":
		return counted(int64(n), "tombstone")
	case "dictionary":
		if n == 1 {
			return "1 zstd dictionary, packcache's own key"
		}
		return count(int64(n)) + " zstd dictionaries, packcache's own keys"
	}
	return count(int64(n)) + " undecodable"
}

// medianBand returns the index of the value of median decoded size, and
// the indexes of the values nearest it in size: the middle fifth of the
// sample by size (at least the median value), from the smallest.
func medianBand(values []sampled) (median int, band []int) {
	idx := make([]int, len(values))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return len(values[a].decoded) - len(values[b].decoded) })
	m := (len(idx) - 1) / 2
	k := max(1, len(idx)/5)
	start := min(max(0, m-(k-1)/2), len(idx)-k)
	return idx[m], idx[start : start+k]
}

// warm encodes and decodes the values with ch, untimed, so that what
// measure times is what a process that has been writing and reading such
// values for a while pays, not the first uses of the codec.
//
// The zstd codecs keep GOMAXPROCS encoders and take them in turn, and the
// tables of the slower levels are tens of MiB, touched for the first time
// page by page. The first time one of zstd 11's encoders met a profile of
// 200 bytes took 1-20 ms, against 6 µs once warm, and its first clearing
// of its tables (every 256 values or so) 160-260 ms, against 2 ms later:
// timed cold, zstd 11's column read "encode 1 MB/s" beside "Set µs 17.5"
// (the median value, timed longer) for 202 bytes. So each value is
// encoded GOMAXPROCS+1 times in a row, for every encoder to meet it, and
// the sample again until each encoder has cleared its tables once
// (warmCalls) or has taken in warmBytes, which touches every page of them.
func warm(ch choice, values []sampled, limit int) error {
	p := runtime.GOMAXPROCS(0)
	var enc, dec []byte
	calls, bytes := 0, 0
	for calls < warmCalls*p && bytes < warmBytes*p || calls == 0 {
		for _, v := range values {
			// A large value touches the tables' pages itself, and
			// takes long enough that what its first meeting with an
			// encoder costs is lost in it.
			reps := p + 1
			if len(v.decoded) >= warmLarge {
				reps = 1
			}
			for range reps {
				var err error
				if enc, err = codec.AppendValue(enc[:0], ch.c, v.decoded); err != nil {
					return fmt.Errorf("%s: encoding %s: %w", ch, v.key, err)
				}
				if dec, err = codec.DecodeValueDict(dec[:0], enc, limit, ch.dict); err != nil {
					return fmt.Errorf("%s: decoding what it encoded from %s: %w", ch, v.key, err)
				}
				calls++
				bytes += len(v.decoded)
			}
		}
	}
	return nil
}

// Warming up (warm): the calls per encoder after which a zstd encoder
// has cleared its tables at least once (it does every 256 or so), or the
// bytes after which it has touched every page of them. (Variables for the
// tests, which shorten them: see TestMain.)
var (
	warmCalls = 300
	warmBytes = 4 << 20
	warmLarge = 64 << 10 // a value warm encodes once a pass, not once for each encoder
)

// measure encodes and decodes every value with ch: the size of each; the
// speeds over the whole sample, every value encoded (decoded) in turn; and
// the CPU a Get and a Set add at about the median size, over band, the
// values nearest it (medianBand). With perValue (for
// the chart) it times each value on its own too. Every timing is of the
// codec warm (warm), as a process that writes and reads such values runs
// it.
func measure(ch choice, values []sampled, band []int, limit int, perValue bool) (*result, error) {
	r := &result{choice: ch, Codec: ch.String(), vals: make([]one, len(values))}
	none := ch.c.ID() == codec.HeaderNone
	if !none {
		if err := warm(ch, values, limit); err != nil {
			return nil, err
		}
	}
	stored := make([][]byte, len(values)) // what ch stores for each value, to time decoding
	var enc, dec []byte
	var sumSize, sumComp float64
	for i, v := range values {
		d := v.decoded
		text := codec.Plain(v.stored) || json.Valid(d)
		o := one{size: len(d), plain: len(d)}
		if !(text && codec.Plain(d)) {
			o.plain++
		}
		sumSize += float64(o.size)
		if none {
			o.comp = o.plain
			r.vals[i] = o
			sumComp += float64(o.comp)
			continue
		}
		var err error
		if stored[i], err = codec.AppendValue(nil, ch.c, d); err != nil {
			return nil, fmt.Errorf("%s: encoding %s: %w", ch, v.key, err)
		}
		if dec, err = codec.DecodeValueDict(dec[:0], stored[i], limit, ch.dict); err != nil || len(dec) != len(d) {
			return nil, fmt.Errorf("%s: decoding what it encoded from %s: %v", ch, v.key, err)
		}
		o.comp = len(stored[i])
		sumComp += float64(o.comp)
		if perValue {
			e := stored[i]
			o.enc = timeOp(minOpTime, func() { enc, _ = codec.AppendValue(enc[:0], ch.c, d) })
			o.dec = timeOp(minOpTime, func() { dec, _ = codec.DecodeValueDict(dec[:0], e, limit, ch.dict) })
		}
		r.vals[i] = o
	}
	r.Ratio = sumComp / sumSize
	if !none {
		// Every value in turn, as many times as fill minSampleTime: the
		// rare slow calls (a zstd encoder clearing its tables) count as
		// often as they come, and no more.
		encNs := timeOp(minSampleTime, func() {
			for _, v := range values {
				enc, _ = codec.AppendValue(enc[:0], ch.c, v.decoded)
			}
		})
		decNs := timeOp(minSampleTime, func() {
			for _, e := range stored {
				dec, _ = codec.DecodeValueDict(dec[:0], e, limit, ch.dict)
			}
		})
		r.EncMBs = sumSize / encNs * 1e3 // bytes per ns is GB/s
		r.DecMBs = sumSize / decNs * 1e3
	}
	r.breakEven()
	r.threshold()
	// The CPU a Get and a Set add at about the median size: the values
	// nearest it, in turn, as the sample's speeds are timed; a value the
	// threshold stores plain adds nothing to a Get, and one at or under
	// it nothing to a Set.
	var set, get [][2][]byte // a value and what ch stores for it
	for _, i := range band {
		if v := r.vals[i]; !none && r.Above >= 0 && v.size > r.Above {
			set = append(set, [2][]byte{values[i].decoded, stored[i]})
			if v.saves() {
				get = append(get, set[len(set)-1])
			}
		}
	}
	if len(set) > 0 {
		r.SetUs = timeOp(minMedianTime, func() {
			for _, v := range set {
				enc, _ = codec.AppendValue(enc[:0], ch.c, v[0])
			}
		}) / float64(len(band)) / 1e3
	}
	if len(get) > 0 {
		r.GetUs = timeOp(minMedianTime, func() {
			for _, v := range get {
				dec, _ = codec.DecodeValueDict(dec[:0], v[1], limit, ch.dict)
			}
		}) / float64(len(band)) / 1e3
	}
	return r, nil
}

// timeOp returns the ns per call of f, the least of up to timedRuns runs
// of calls lasting about min each (fewer if they take over timedRuns x min
// in all). The number of calls in a run is fixed before the runs that are
// timed, by an untimed calibration of about a tenth of min: a run that
// ends as soon as its own calls have taken min reports a rare slow call
// (zstd 11's encoders clear their tables every 256 values or so, for
// milliseconds) with the weight of the few calls it ended, and the sum of
// such runs over 500 profiles came to twice the mean of one long run of
// the same calls. The clock is the thread's CPU time (clock), which other
// processes of a busy machine do not add to; the least of the runs also
// leaves out what they cost it otherwise (caches emptied, a GC's share),
// and a run lasts long enough to hold the slow calls that come with the
// codec.
func timeOp(min time.Duration, f func()) float64 {
	// One thread's CPU clock times only that thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	calibration := max(min/10, 1)
	n := 1
	for {
		start := clock()
		for range n {
			f()
		}
		el := clock() - start
		if el >= calibration {
			n = max(1, int(float64(n)*float64(min)/float64(el)))
			break
		}
		if el <= 0 {
			n *= 10
			continue
		}
		n = int(float64(n)*1.2*float64(calibration)/float64(el)) + 1
	}
	best := math.Inf(1)
	var total time.Duration
	for range timedRuns {
		start := clock()
		for range n {
			f()
		}
		el := clock() - start
		best = math.Min(best, float64(el.Nanoseconds())/float64(n))
		if total += el; total >= timedRuns*min {
			break
		}
	}
	return best
}

// timedRuns is how many runs timeOp times, at most.
const timedRuns = 3

// bucket is a value's size class: values from 2^b to 2^(b+1)-1 bytes.
func bucket(size int) int { return bits.Len(uint(size)) }

// breakEven finds the smallest sampled size from which compression saves
// bytes: the smallest value of the smallest size class (powers of two)
// from which every class saves in total.
func (r *result) breakEven() {
	type sums struct{ comp, plain, smallest int }
	byBucket := map[int]*sums{}
	for _, v := range r.vals {
		b := bucket(v.size)
		s := byBucket[b]
		if s == nil {
			s = &sums{smallest: v.size}
			byBucket[b] = s
		}
		s.comp += v.comp
		s.plain += v.plain
		s.smallest = min(s.smallest, v.size)
	}
	var keys []int
	for b := range byBucket {
		keys = append(keys, b)
	}
	slices.Sort(keys)
	r.BreakEven = -1
	for i := len(keys) - 1; i >= 0; i-- {
		s := byBucket[keys[i]]
		if s.comp+minSaving > s.plain {
			break
		}
		r.BreakEven = s.smallest
		r.EveryValue = i == 0
	}
	if r.choice.c.ID() == codec.HeaderNone {
		r.BreakEven, r.EveryValue = -1, false
	}
}

// storedAt is the bytes the sampled values take with threshold above
// (never when negative).
func (r *result) storedAt(above int) float64 {
	var n float64
	for _, v := range r.vals {
		if above >= 0 && v.size > above && v.saves() {
			n += float64(v.comp)
		} else {
			n += float64(v.plain)
		}
	}
	return n
}

// threshold picks the largest size (0, 64, 128, ... up to 4 KiB or a
// larger break-even size) at or below which values can be stored plain while
// keeping all but tieShare of what compressing everything saves. A codec
// that saves nothing gets -1: off.
func (r *result) threshold() {
	plain := r.storedAt(-1)
	full := plain - r.storedAt(0)
	if full <= 0 || r.choice.c.ID() == codec.HeaderNone {
		r.Above = -1
		return
	}
	// Past 4 KiB only up to a break-even the sample shows: when every
	// sampled value saves, the break-even is below the smallest sample,
	// and sizes no sample had are no reason to store values plain.
	top := 4096
	if !r.EveryValue {
		top = max(top, r.BreakEven)
	}
	r.Above = 0
	for t := 64; t <= top; t *= 2 {
		if plain-r.storedAt(t) >= (1-tieShare)*full {
			r.Above = t
		}
	}
}

// project works out the stored bytes of the sample and the projected
// memory of the prefix: the prefix's memory now, scaled by how the sample's
// MEMORY USAGE changes when each measured value's allocation is replaced by
// the one for what the codec stores (the unmeasured ones stay as they are).
// memSample is the sample's MEMORY USAGE now, memOther that of its
// unmeasured values.
func (r *result) project(values []sampled, memOther, memSample, memNow float64) {
	r.Stored = r.storedAt(r.Above)
	mem := memOther
	for i, v := range values {
		o := r.vals[i]
		n := o.plain
		if r.Above >= 0 && o.size > r.Above && o.saves() {
			n = o.comp
		}
		mem += float64(v.mem - redisAlloc(len(v.stored)) + redisAlloc(n))
	}
	r.Memory = memNow * mem / memSample
	t := target{choice: r.choice, above: r.Above}
	if r.Above < 0 {
		t.above = never
	}
	r.Policy = t.policyLiteral()
}

// redisAlloc estimates the bytes Redis allocates for a string value of n
// bytes: an sds header, the bytes and a NUL, rounded up to jemalloc's size
// class. MEMORY USAGE counts the allocation, not the length, so a
// projection that swapped bytes for bytes would keep the old value's
// rounding (up to a quarter of its size).
func redisAlloc(n int) int64 {
	hdr := 3 // sdshdr8
	switch {
	case n >= 1<<16:
		hdr = 9
	case n >= 1<<8:
		hdr = 5
	}
	size := int64(hdr + n + 1)
	switch {
	case size <= 8:
		return 8
	case size <= 128:
		return (size + 15) &^ 15
	}
	// Four classes per doubling: from 2^k (exclusive) to 2^(k+1), steps of
	// 2^(k-2).
	step := int64(1) << (bits.Len64(uint64(size-1)) - 3)
	return (size + step - 1) / step * step
}

// recommend applies the rule stated in advise's help.
func recommend(results []*result) *result {
	minMem := math.Inf(1)
	for _, r := range results {
		if r.Eligible {
			minMem = min(minMem, r.Memory)
		}
	}
	var best *result
	for _, r := range results {
		if !r.Eligible || r.Memory > minMem*(1+tieShare) {
			continue
		}
		if best == nil || r.GetUs+r.SetUs < best.GetUs+best.SetUs {
			best = r
		}
	}
	return best
}

func reason(best *result, results []*result, o adviseOptions) string {
	var smallest *result
	for _, r := range results {
		if smallest == nil || r.Memory < smallest.Memory {
			smallest = r
		}
	}
	var s strings.Builder
	fmt.Fprintf(&s, "%s projects %s of Redis memory", best.Codec, bytesIEC(best.Memory))
	if best.choice.c.ID() != codec.HeaderNone {
		fmt.Fprintf(&s, " and adds %.1f µs per Get and %.1f µs per Set at about the median size", best.GetUs, best.SetUs)
	}
	if smallest != best {
		switch {
		case !smallest.Eligible:
			fmt.Fprintf(&s, "; %s would project %s but adds %.1f µs per Get and %.1f µs per Set, over the bounds (--max-get-us %g, --max-set-us %g)",
				smallest.Codec, bytesIEC(smallest.Memory), smallest.GetUs, smallest.SetUs, o.maxGetUs, o.maxSetUs)
		default:
			fmt.Fprintf(&s, "; %s projects %s, within %g%%, for more CPU", smallest.Codec, bytesIEC(smallest.Memory), 100*tieShare)
		}
	}
	return s.String()
}

// sizeCells returns r's break-even and threshold cells: "-" for none,
// which compresses nothing.
func sizeCells(r *result) (breakEven, above string) {
	if r.choice.c.ID() == codec.HeaderNone {
		return "-", "-"
	}
	switch {
	case r.BreakEven < 0:
		breakEven = "never"
	case r.EveryValue:
		breakEven = "< " + bytesIEC(float64(r.BreakEven))
	default:
		breakEven = bytesIEC(float64(r.BreakEven))
	}
	switch {
	case r.Above < 0:
		above = "off"
	case r.Above == 0:
		above = "0 (all)"
	default:
		above = bytesIEC(float64(r.Above))
	}
	return breakEven, above
}

func printAdvice(w io.Writer, rep *adviceReport, g *group, sizes []int64) {
	if rep.TrainedOn > 0 {
		fmt.Fprintf(w, "advise %s  %s keys, %d values sampled: %d to train the dictionary on, %d measured\n", rep.Prefix, count(rep.Keys), rep.Sampled, rep.TrainedOn, rep.Measured)
	} else {
		fmt.Fprintf(w, "advise %s  %s keys, %d values sampled, %d measured\n", rep.Prefix, count(rep.Keys), rep.Sampled, rep.Measured)
	}
	fmt.Fprintf(w, "  value sizes (decoded): min %s  p10 %s  median %s  p90 %s  max %s\n",
		bytesIEC(float64(sizes[0])), bytesIEC(float64(percentile(sizes, 10))), bytesIEC(float64(rep.MedianBytes)),
		bytesIEC(float64(percentile(sizes, 90))), bytesIEC(float64(sizes[len(sizes)-1])))
	var mix []string
	for _, m := range g.Mix {
		mix = append(mix, fmt.Sprintf("%s %s", m.Codec, share(float64(m.Keys), float64(g.Keys))))
	}
	fmt.Fprintf(w, "  now: stored %s (%s), memory (est.) %s\n", bytesIEC(float64(rep.StoredNow)), strings.Join(mix, ", "), bytesIEC(rep.MemoryNow))
	if len(rep.NotMeasured) > 0 {
		var n int
		for _, c := range rep.NotMeasured {
			n += c
		}
		fmt.Fprintf(w, "  %s not measured (%s); kept at their size in the projection\n", counted(int64(n), "sampled value"), notMeasuredList(rep.NotMeasured))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcodec\tratio\tencode MB/s\tdecode MB/s\tbreak-even\tthreshold\tmemory (est.)\tGet µs\tSet µs\t")
	for _, r := range rep.Results {
		mark := ""
		if r.Codec == rep.Recommended {
			mark = "*"
		}
		speed := func(v float64) string {
			if v == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f", v)
		}
		breakEven, above := sizeCells(r)
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t\n", mark, r.Codec, r.Ratio, speed(r.EncMBs), speed(r.DecMBs),
			breakEven, above, bytesIEC(r.Memory), r.GetUs, r.SetUs)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n  ratio: stored/plain bytes of the sample with every value compressed;\n")
	fmt.Fprintf(w, "  MB/s: the sample's decoded bytes (10^6) per second, every value encoded (decoded) in turn, the codec warm;\n")
	fmt.Fprintf(w, "  break-even: smallest sampled size from which compressing saves bytes (< X: every sampled value saves);\n")
	fmt.Fprintf(w, "  memory: MEMORY USAGE of the sample with each value's allocation replaced, x %s keys, at the threshold shown;\n", count(rep.Keys))
	if rep.BandValues == 1 {
		fmt.Fprintf(w, "  Get/Set µs: CPU the codec adds at the median value (%s), timed as the MB/s are; 0 where the threshold stores it plain.\n", bytesIEC(float64(rep.MedianBytes)))
	} else {
		fmt.Fprintf(w, "  Get/Set µs: CPU the codec adds at about the median size (%s): the mean over the %d sampled values of %s to %s,\n",
			bytesIEC(float64(rep.MedianBytes)), rep.BandValues, bytesIEC(float64(rep.BandBytes[0])), bytesIEC(float64(rep.BandBytes[1])))
		fmt.Fprintf(w, "    timed as the MB/s are; 0 for those the threshold stores plain.\n")
	}
	fmt.Fprintf(w, "\nrecommended: %s\n", rep.Recommended)
	fmt.Fprintf(w, "  rule:   %s\n", rep.Rule)
	fmt.Fprintf(w, "  reason: %s\n\n", rep.Reason)
	fmt.Fprintf(w, "  %s\n\n", rep.Policy)
	for _, e := range rep.Env {
		fmt.Fprintf(w, "  %s\n", e)
	}
	if t := g.TTL; t.WithExpiry > 0 || t.WithoutExpiry > 0 {
		spread := fmt.Sprintf("min %s, p50 %s, max %s", ttlString(t.MinMillis), ttlString(t.P50Millis), ttlString(t.MaxMillis))
		if t.WithExpiry == 0 {
			spread = "none expire"
		}
		fmt.Fprintf(w, "  # TTL is not part of this advice (remaining TTLs now: %s; %s keys without expiry);\n  # PACKCACHE_PREFIX_%s_TTL sets it.\n", spread, count(t.WithoutExpiry), envName(rep.Prefix))
	}
}
