package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"golang.org/x/time/rate"

	"github.com/packcache/packcache/codec"
)

func newRecompressCmd(cf *connFlags) *cobra.Command {
	var o recompressOptions
	var codecName, above, rateFlag, dictFile, dictID string
	var level int
	cmd := &cobra.Command{
		Use:   "recompress --prefix P --codec NAME [--level L] [--dictionary FILE | --dictionary-id ID] [--compress-above N] [--dry-run] [--rate N/s] [--cursor C]",
		Short: "Rewrite the values under a prefix with a new codec, level and threshold",
		Long: `recompress rewrites the values under --prefix in place as a packcache writer with the
given policy would store them: values longer than --compress-above bytes compressed with
--codec at --level (kept compressed only if that saves a byte), the others plain (or
framed with 01 when they are not JSON or begin with a header byte, FORMAT.md section 5).

Each value is written back with a compare-and-set script that first checks the SHA-1 of
the current value against that of the value read, so a value a writer changed meanwhile
is left as the writer wrote it; SET ... KEEPTTL keeps each key's remaining TTL. Values
already stored as the policy would store them are left alone, and so are tombstones,
leases, keys that are not strings, and values that cannot be decoded (listed).

It prints its SCAN cursor as it goes, N@ID where ID names the server process (on a
cluster one per master, host:port=N@ID joined by commas); --cursor resumes from one,
on the same server processes only. --rate limits the values read (GET) per second;
the scan, the size checks and the writes are not throttled.
Codecs: none, lz4 (--level 0 fast, 1-9 HC; default 0), snappy, zstd (--level 1-22,
default 1).

--dictionary FILE (one that advise --train or zstd --train wrote) or --dictionary-id ID
(one Redis holds, as packcache:dict:ID) writes zstd with that dictionary (FORMAT.md
section 3.6); --codec may then be left out, and --compress-above defaults to 64. A
dictionary from a file is first published under packcache:dict:ID, where every reader
finds it, unless --dry-run. Values written with a dictionary Redis does not hold are
skipped as undecodable, and kept. Keys under packcache:dict:, packcache's own
dictionaries, are never rewritten.

--count is the COUNT hint of each SCAN (default 500); --progress draws progress on
stderr even when it is not a terminal.

recompress writes, so it needs its server named: --addr (with --cluster, the seeds),
--url, $PACKCACHE_ADDR or $PACKCACHE_URL. It never falls back to 127.0.0.1:6379, not
even for --dry-run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.prefix == "" {
				return usagef("--prefix must not be empty: recompress works on one prefix at a time")
			}
			withDict := dictFile != "" || dictID != ""
			switch {
			case dictFile != "" && dictID != "":
				return usagef("give --dictionary or --dictionary-id, not both")
			case codecName == "" && !withDict:
				return usagef(`required flag(s) "codec" not set`)
			case codecName == "":
				codecName = "zstd"
			case withDict && !strings.EqualFold(codecName, "zstd"):
				return usagef("a dictionary is zstd's: --codec zstd, or leave --codec out")
			}
			if o.target.choice, err = parseChoice(codecName, level, cmd.Flags().Changed("level")); err != nil {
				return err
			}
			if withDict && !cmd.Flags().Changed("compress-above") {
				above = strconv.Itoa(codec.DictionaryCompressAbove)
			}
			if o.target.above, err = parseAbove(above); err != nil {
				return err
			}
			if o.rate, err = parseRate(rateFlag); err != nil {
				return err
			}
			if o.count <= 0 {
				return usagef("--count must be positive")
			}
			c, err := cf.connect(cmd.Context(), "recompress", cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			if withDict {
				d, err := loadDictionary(cmd.Context(), c, dictFile, dictID)
				if err != nil {
					return err
				}
				o.target.choice = o.target.withDictionary(d)
				o.publish = dictFile != "" && !o.dryRun
			}
			o.progress = showProgress(o.progressFlag, cmd.ErrOrStderr())
			return recompress(cmd.Context(), c, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.prefix, "prefix", "", "key prefix whose values to rewrite (required)")
	fs.StringVar(&codecName, "codec", "", "codec to write: none, lz4, snappy or zstd (required, but with a dictionary)")
	fs.IntVar(&level, "level", 0, "level: zstd 1-22, lz4 0 (fast) or 1-9 (HC)")
	fs.StringVar(&dictFile, "dictionary", "", "write zstd with the dictionary in this `file`, published in Redis first")
	fs.StringVar(&dictID, "dictionary-id", "", "write zstd with the dictionary Redis holds under packcache:dict:`ID`")
	fs.StringVar(&above, "compress-above", strconv.Itoa(defaultCompressAbove), "size in bytes at or below which values are stored plain, or off")
	fs.BoolVar(&o.dryRun, "dry-run", false, "read and compute everything, write nothing")
	fs.StringVar(&rateFlag, "rate", "", "most keys to read per second, as N/s or N (default unlimited)")
	fs.StringVar(&o.cursor, "cursor", "", "resume from this cursor, as printed by an earlier run")
	o.scanFlags.register(cmd, 500)
	cmd.MarkFlagRequired("prefix")
	return cmd
}

type recompressOptions struct {
	scanFlags
	prefix  string
	target  target
	publish bool // store the target's dictionary in Redis before any value written with it
	dryRun  bool
	rate    rate.Limit // 0: unlimited
	cursor  string
}

// parseRate reads --rate: "N/s" or "N" keys per second.
func parseRate(s string) (rate.Limit, error) {
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
	if err != nil || !(f > 0) {
		return 0, usagef("--rate takes keys per second as N/s, for example 500/s, not %q", s)
	}
	return rate.Limit(f), nil
}

// casScript writes ARGV[2] to KEYS[1], keeping its TTL, only if the key
// still holds the value whose SHA-1 is ARGV[1]: a value that a writer
// changed after recompress read it stays as the writer wrote it. It
// returns 1 if it wrote, 0 if the value changed, -1 if the key is no
// longer a string and -2 if it is gone.
var casScript = redis.NewScript(`
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' and cur.err then return -1 end
if not cur then return -2 end
if redis.sha1hex(cur) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1`)

// testHookAfterRead, when a test sets it, runs after a batch of values has
// been read and before any of them is written back.
var testHookAfterRead func(keys []string)

// tally is what recompress did, key by key.
type tally struct {
	examined     int64 // string values read
	rewritten    int64 // written back (or, with --dry-run, would be)
	unchanged    int64 // already stored as the policy stores them
	changed      int64 // replaced by a writer between read and write: left alone
	gone         int64 // deleted or expired before they could be read or written
	notStrings   int64
	tombstones   int64
	leases       int64
	empty        int64
	undecodable  int64
	dictionaries int64 // keys of packcache's own, packcache:dict:<id>: never rewritten
	before       int64 // stored bytes of the values read
	after        int64 // the same after rewriting
}

type recompressor struct {
	c       *conn
	o       recompressOptions
	out     io.Writer
	bar     *progress
	limiter *rate.Limiter
	scan    *scanner

	mu        sync.Mutex // guards t, lastPrint and writes to out
	t         tally
	lastPrint time.Time
}

func recompress(ctx context.Context, c *conn, o recompressOptions, stdout, stderr io.Writer) error {
	var from cursors
	if o.cursor != "" {
		masters, err := c.masterNames(ctx)
		if err != nil {
			return err
		}
		if from, err = parseCursors(o.cursor, masters); err != nil {
			return err
		}
	}
	r := &recompressor{c: c, o: o, out: stdout}
	r.scan = newScanner(c, matchPattern(o.prefix), o.count, from)
	total, err := r.scan.countKeys(ctx)
	if err != nil {
		return err
	}
	if total == 0 {
		if o.cursor != "" {
			return fmt.Errorf("no keys under prefix %q from cursor %s", o.prefix, o.cursor)
		}
		return fmt.Errorf("no keys under prefix %q", o.prefix)
	}
	if !o.dryRun {
		// Loaded once per master so the pipelines can use EVALSHA.
		err := c.eachMaster(ctx, func(ctx context.Context, node *redis.Client, _ string) error {
			return casScript.Load(ctx, node).Err()
		})
		if err != nil {
			return fmt.Errorf("SCRIPT LOAD: %w", err)
		}
	}
	if o.rate > 0 {
		r.limiter = rate.NewLimiter(o.rate, max(1, min(readBatchKeys, int(o.rate))))
	}
	mode := ""
	if o.dryRun {
		mode = " (dry run: nothing is written)"
	}
	fmt.Fprintf(stdout, "recompress --prefix %s to %s, compress above %s%s\n", o.prefix, o.target.choice, aboveString(o.target.above), mode)
	fmt.Fprintf(stdout, "%s to examine\n", counted(total, "key"))
	if o.publish { // before any value written with it, as FORMAT.md section 3.6 requires
		if err := publishDictionary(ctx, c.rdb, o.target.dict); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "published the dictionary as %s\n", codec.DictionaryKey(o.target.dict.ID()))
	}
	r.bar = newProgress(o.progress, stderr, total, "recompress", "keys")
	start := time.Now()
	r.scan.moved = r.printCursor
	err = r.scan.run(ctx, r.page)
	r.bar.finish()
	r.report(time.Since(start))
	cur := r.scan.cursors()
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(stdout, "interrupted; resume with: --cursor %s\n", cur)
		return errInterrupted
	case err != nil:
		fmt.Fprintf(stdout, "stopped by an error; resume with: --cursor %s\n", cur)
		return err
	}
	fmt.Fprintln(stdout, "cursor: done (the scan is complete)")
	return nil
}

func aboveString(n int) string {
	if n == never {
		return "never (off)"
	}
	return count(int64(n)) + " bytes"
}

// printCursor prints the cursor at most once a second as the scan moves,
// so that a run killed outright can still be resumed from near where it
// was.
func (r *recompressor) printCursor() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.lastPrint) < time.Second {
		return
	}
	r.lastPrint = time.Now()
	r.bar.clear()
	fmt.Fprintf(r.out, "cursor: %s\n", r.scan.cursors())
}

// page rewrites one page of scanned keys.
func (r *recompressor) page(ctx context.Context, keys []string) error {
	pipe := r.c.rdb.Pipeline()
	lens := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		lens[i] = pipe.StrLen(ctx, k)
	}
	pipe.Exec(ctx)
	var batch []string
	var size int64
	burst := readBatchKeys
	if r.limiter != nil {
		burst = r.limiter.Burst()
	}
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := r.batch(ctx, batch)
		batch, size = batch[:0], 0
		return err
	}
	for i, k := range keys {
		n, err := lens[i].Result()
		switch {
		case isWrongType(err):
			r.count(func(t *tally) { t.notStrings++ })
			r.bar.add(1)
			continue
		case err != nil:
			return fmt.Errorf("STRLEN %s: %w", k, err)
		}
		if len(batch) > 0 && (len(batch) >= burst || size+n > readBatchBytes) {
			if err := flush(); err != nil {
				return err
			}
		}
		batch = append(batch, k)
		size += n
	}
	return flush()
}

func (r *recompressor) count(f func(*tally)) {
	r.mu.Lock()
	f(&r.t)
	r.mu.Unlock()
}

// batch reads keys, works out each new value, and writes back those that
// differ with the compare-and-set script.
func (r *recompressor) batch(ctx context.Context, keys []string) error {
	if r.limiter != nil {
		if err := r.limiter.WaitN(ctx, len(keys)); err != nil {
			return ctx.Err()
		}
	}
	pipe := r.c.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
	}
	pipe.Exec(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if testHookAfterRead != nil {
		testHookAfterRead(keys)
	}
	type write struct {
		key      string
		old, new []byte
		err      error // the value could not be decoded
	}
	var work []write
	var t tally
	for i, k := range keys {
		v, err := gets[i].Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			t.gone++
			continue
		case isWrongType(err):
			t.notStrings++
			continue
		case err != nil:
			return fmt.Errorf("GET %s: %w", k, err)
		}
		t.examined++
		t.before += int64(len(v))
		t.after += int64(len(v))
		switch classifyKey(k, v, len(v)) {
		case kindDictionary:
			// packcache's own key: rewritten, it would no longer be
			// the dictionary readers fetch, and every value written
			// with it would be unreadable.
			t.dictionaries++
			continue
		case kindTombstone:
			t.tombstones++
			continue
		case kindLease:
			t.leases++
			continue
		case kindEmpty:
			// Not something packcache writes (it frames an empty
			// value as 01): leave it to whoever did.
			t.empty++
			continue
		}
		work = append(work, write{key: k, old: v})
	}
	// Decoding and encoding are the CPU of a run: spread them over the
	// cores (the codecs are safe for concurrent use).
	var encErr error
	var errOnce sync.Once
	parallel(len(work), func(i int) {
		w := &work[i]
		decoded, _, err := r.c.decode(ctx, w.old)
		if err != nil {
			w.err = err
			return
		}
		// A plain value was JSON stored verbatim; a framed one may have
		// been binary, which must stay framed (FORMAT.md section 5).
		text := codec.Plain(w.old) || json.Valid(decoded)
		if w.new, err = r.o.target.store(nil, decoded, text); err != nil {
			errOnce.Do(func() { encErr = fmt.Errorf("%s: encoding with %s: %w", w.key, r.o.target.choice, err) })
		}
	})
	if encErr != nil {
		return encErr
	}
	var writes []write
	var skipped []string
	for _, w := range work {
		switch {
		case w.err != nil:
			t.undecodable++
			skipped = append(skipped, fmt.Sprintf("skipped %s: %v", w.key, w.err))
		case bytes.Equal(w.new, w.old):
			t.unchanged++
		default:
			writes = append(writes, w)
		}
	}
	if len(writes) > 0 && !r.o.dryRun {
		pipe := r.c.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(writes))
		for i, w := range writes {
			sum := sha1.Sum(w.old)
			cmds[i] = pipe.EvalSha(ctx, casScript.Hash(), []string{w.key}, hex.EncodeToString(sum[:]), w.new)
		}
		pipe.Exec(ctx)
		for i, w := range writes {
			res, err := cmds[i].Int()
			if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				// The script cache was flushed, or a failover
				// brought a master that never loaded it.
				sum := sha1.Sum(w.old)
				res, err = casScript.Run(ctx, r.c.rdb, []string{w.key}, hex.EncodeToString(sum[:]), w.new).Int()
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("compare-and-set of %s: %w", w.key, err)
			}
			switch res {
			case 1:
				t.rewritten++
				t.after += int64(len(w.new) - len(w.old))
			case 0:
				t.changed++
			case -1:
				t.notStrings++
			default:
				t.gone++
			}
		}
	} else {
		for _, w := range writes {
			t.rewritten++
			t.after += int64(len(w.new) - len(w.old))
		}
	}
	r.mu.Lock()
	if len(skipped) > 0 {
		r.bar.clear()
		for _, s := range skipped {
			fmt.Fprintln(r.out, s)
		}
	}
	r.t.add(t)
	r.mu.Unlock()
	r.bar.add(len(keys))
	return nil
}

// parallel calls f(0) to f(n-1) on as many goroutines as there are
// processors to run them.
func parallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		})
	}
	wg.Wait()
}

func (t *tally) add(u tally) {
	t.examined += u.examined
	t.rewritten += u.rewritten
	t.unchanged += u.unchanged
	t.changed += u.changed
	t.gone += u.gone
	t.notStrings += u.notStrings
	t.tombstones += u.tombstones
	t.leases += u.leases
	t.empty += u.empty
	t.undecodable += u.undecodable
	t.dictionaries += u.dictionaries
	t.before += u.before
	t.after += u.after
}

func (r *recompressor) report(took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.t
	w := tabwriter.NewWriter(r.out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	row := func(name, format string, args ...any) {
		fmt.Fprintf(w, "  %s\t%s\n", name, fmt.Sprintf(format, args...))
	}
	verb := "rewritten"
	if r.o.dryRun {
		verb = "would rewrite"
	}
	row("examined", "%s values", count(t.examined))
	row(verb, "%s", count(t.rewritten))
	row("already as target", "%s (left alone)", count(t.unchanged))
	if !r.o.dryRun {
		row("changed meanwhile", "%s (a writer replaced them after they were read; left as written)", count(t.changed))
	}
	dicts := ""
	if t.dictionaries > 0 {
		dicts = fmt.Sprintf(", %s dictionaries (packcache's own keys, never rewritten)", count(t.dictionaries))
		if t.dictionaries == 1 {
			dicts = ", 1 dictionary (packcache's own key, never rewritten)"
		}
	}
	row("skipped", "%s undecodable, %s leases, %s tombstones, %s not strings, %s empty, %s gone%s",
		count(t.undecodable), count(t.leases), count(t.tombstones), count(t.notStrings), count(t.empty), count(t.gone), dicts)
	after := "after"
	if r.o.dryRun {
		after = "after (projected)"
	}
	change := ""
	if t.before > 0 {
		change = fmt.Sprintf(" (%+.1f%%)", 100*float64(t.after-t.before)/float64(t.before))
	}
	row("stored bytes", "before %s, %s %s%s", bytesIEC(float64(t.before)), after, bytesIEC(float64(t.after)), change)
	n := t.examined + t.notStrings + t.gone
	row("took", "%v (%.0f keys/s)", took.Round(time.Millisecond), float64(n)/max(took.Seconds(), 1e-9))
}
