package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/packcache/packcache/codec"
)

func newInspectCmd(cf *connFlags) *cobra.Command {
	var raw, asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect KEY...",
		Short: "Show how keys are stored: header, codec, sizes, TTL, memory, and the value",
		Long: `inspect shows, for each key, its header byte and what it means (codec; plain;
tombstone; lease; a user codec; an unknown or reserved byte, with what FORMAT.md says
about it), the stored and decoded sizes and their ratio, the TTL, MEMORY USAGE, and the
decoded JSON pretty-printed. For a value it cannot decode it gives the codec's error and
the FORMAT.md rule behind it.

The format does not record compression levels; inspect re-encodes the value with each
level of its codec and says which, if any, reproduce the stored bytes.

A key under packcache:dict: is packcache's own: a zstd dictionary published for the
values written with it (FORMAT.md section 3.6), not a cached value. inspect says so and
checks it as readers do: its name is packcache:dict: and an id in 8 lower-case hex
digits, and it holds a dictionary of at most 128 KiB whose bytes hash to that id.

--raw prints the value as stored instead of the decoded JSON; --json prints a
machine-readable report, a JSON array with one object per key (with --raw, each with
the stored bytes in base64).

It exits 1 if any key is missing, is not a string, cannot be decoded, or is a
dictionary key readers would refuse.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, keys []string) error {
			c, err := cf.connect(cmd.Context(), "", cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			return inspect(cmd.Context(), c, keys, raw, asJSON, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&raw, "raw", false, "print the value as stored instead of the decoded JSON pretty-printed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a machine-readable report (a JSON array, one object per key)")
	return cmd
}

// keyReport is what inspect finds out about one key; it is also the --json
// report.
type keyReport struct {
	Key         string          `json:"key"`
	Exists      bool            `json:"exists"`
	Type        string          `json:"type"`
	Header      string          `json:"header,omitempty"` // the first byte, "0x04"
	Kind        string          `json:"kind,omitempty"`   // plain, none, lz4, snappy, zstd, gzip, tombstone, lease, user 0x.., unknown 0x.., empty, dictionary
	Meaning     string          `json:"meaning,omitempty"`
	Level       string          `json:"level,omitempty"`
	Stored      int             `json:"stored_bytes"`
	Decoded     *int            `json:"decoded_bytes,omitempty"`
	Ratio       *float64        `json:"ratio,omitempty"` // stored / decoded
	TTLMillis   int64           `json:"ttl_ms"`          // -1: no expiry, -2: no such key
	MemoryUsage int64           `json:"memory_usage_bytes,omitempty"`
	LeaseToken  string          `json:"lease_token,omitempty"`
	Envelope    *envelopeReport `json:"envelope,omitempty"`   // a value in groups or with a TTL of its own: its envelope, and its groups' state; header, kind and sizes are then those of the value inside
	Dictionary  string          `json:"dictionary,omitempty"` // the zstd dictionary a 0x05 value names: its key in Redis, and what it holds; for a dictionary's own key, what readers make of it
	Error       string          `json:"error,omitempty"`
	FormatNote  string          `json:"format_note,omitempty"`
	Notes       []string        `json:"notes,omitempty"`

	Value       json.RawMessage `json:"value,omitempty"`        // the decoded JSON
	ValueBase64 []byte          `json:"value_base64,omitempty"` // a decoded value that is not JSON
	StoredRaw   []byte          `json:"stored_base64,omitempty"`

	stored  []byte // the value as stored
	decoded []byte
	failed  bool // missing, not a string, or not decodable
}

func inspect(ctx context.Context, c *conn, keys []string, raw, asJSON bool, w io.Writer) error {
	var reports []*keyReport
	var failed []string
	for _, key := range keys {
		r, err := inspectKey(ctx, c, key)
		if err != nil {
			return err
		}
		if asJSON && raw {
			r.StoredRaw = r.stored
		}
		reports = append(reports, r)
		if r.failed {
			failed = append(failed, key)
		}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(reports); err != nil {
			return err
		}
	} else {
		for i, r := range reports {
			if i > 0 {
				fmt.Fprintln(w)
			}
			printReport(w, r, raw)
		}
	}
	switch {
	case len(failed) == 1:
		return fmt.Errorf("%s: %s", failed[0], reportProblem(reports, failed[0]))
	case len(failed) > 1:
		return fmt.Errorf("%d of %d keys are missing, not strings, or not decodable: %s", len(failed), len(keys), strings.Join(failed, ", "))
	}
	return nil
}

func reportProblem(reports []*keyReport, key string) string {
	for _, r := range reports {
		if r.Key == key {
			switch {
			case !r.Exists:
				return "no such key"
			case r.Type != "string":
				return fmt.Sprintf("a %s, not a string: packcache stores strings", r.Type)
			default:
				return r.Error
			}
		}
	}
	return ""
}

// inspectKey reads one key and works out everything inspect shows. Only
// Redis failures are errors; what is wrong with the key is in the report.
func inspectKey(ctx context.Context, c *conn, key string) (*keyReport, error) {
	r := &keyReport{Key: key}
	pipe := c.rdb.Pipeline()
	typ := pipe.Type(ctx, key)
	get := pipe.Get(ctx, key)
	pttl := pipe.PTTL(ctx, key)
	mem := pipe.MemoryUsage(ctx, key)
	pipe.Exec(ctx) // each command carries its own error
	if err := typ.Err(); err != nil {
		return nil, fmt.Errorf("TYPE %s: %w", key, err)
	}
	r.Type = typ.Val()
	r.TTLMillis = int64(pttl.Val() / 1e6)
	if d := pttl.Val(); d < 0 {
		r.TTLMillis = int64(d) // go-redis passes -1 and -2 through unscaled
	}
	switch r.Type {
	case "none":
		r.Type, r.failed = "", true
		return r, nil
	case "string":
	default:
		r.Exists, r.failed = true, true
		r.MemoryUsage = mem.Val()
		return r, nil
	}
	r.Exists = true
	v, err := get.Bytes()
	if errors.Is(err, redis.Nil) {
		// Expired or deleted between TYPE and GET.
		r.Exists, r.failed = false, true
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", key, err)
	}
	r.stored, r.Stored, r.MemoryUsage = v, len(v), mem.Val()
	if isGroupKey(key) {
		return r, inspectGroupKey(ctx, c, r, key, v)
	}
	if len(v) > 0 && v[0] == codec.HeaderExtended {
		inner, err := inspectEnvelope(ctx, c, r, v)
		if err != nil || inner == nil {
			return r, err
		}
		v = inner // inspected as any value, but for the stored size
	}
	k := classifyKey(key, v, len(v))
	var b byte
	if len(v) > 0 {
		b = v[0]
		if k != kindDictionary { // a dictionary's first byte is its magic's, not a header
			r.Header = fmt.Sprintf("0x%02x", b)
		}
	}
	r.Kind, r.Meaning = mixLabel(k, b), meaning(k, b)
	switch k {
	case kindDictionary:
		inspectDictionary(r, key, v)
		return r, nil
	case kindTombstone:
		return r, nil
	case kindLease:
		r.LeaseToken = hex.EncodeToString(v[1:])
		return r, nil
	}
	if id, ok := codec.DictionaryID(v); ok {
		r.Dictionary = codec.DictionaryKey(id)
	}
	decoded, d, err := c.decode(ctx, v)
	switch {
	case d != nil:
		r.Dictionary += fmt.Sprintf(" (%s, fetched from Redis)", counted(int64(len(d.Bytes())), "byte"))
	case errors.Is(err, codec.ErrUnknownDictionary):
		r.Dictionary += " (missing or refused: see the error)"
	}
	if err != nil {
		r.failed = true
		r.Error = err.Error()
		r.FormatNote = decodeNote(err, b, len(v), c.limit)
		return r, nil
	}
	r.decoded = decoded
	n := len(decoded)
	r.Decoded = &n
	if n > 0 {
		ratio := float64(r.Stored) / float64(n)
		r.Ratio = &ratio
	}
	r.Level = levelNote(k, b, decoded, v, d)
	if json.Valid(decoded) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, decoded); err == nil {
			r.Value = buf.Bytes()
		}
	} else {
		r.ValueBase64 = decoded
	}
	return r, nil
}

// inspectDictionary reports on a key under packcache:dict:, v its value,
// as a reader fetching it would judge it (FORMAT.md section 3.6).
func inspectDictionary(r *keyReport, key string, v []byte) {
	c := checkDictionary(key, v)
	if c.err != nil {
		r.failed = true
		r.Error = c.err.Error()
		r.FormatNote = `FORMAT.md section 3.6: a dictionary is published "under the key packcache:dict:<id as 8 lower-case hex digits>" with no expiry; "A reader meeting an id it does not have fetches that key once, computes the id of what it got and uses it only if it is the id it looked for; it refuses one over 128 KiB." ` +
			`"Missing or not verified, the value is an unknown dictionary: kept, never deleted, and reported naming the id." Values naming this id cannot be read until a writer publishes the dictionary again.`
		if c.d != nil {
			r.Dictionary = fmt.Sprintf("holds dictionary %08x, %s", c.d.ID(), counted(int64(len(v)), "byte"))
		}
		return
	}
	s := fmt.Sprintf("id %08x, verified as readers verify it: its bytes hash to the id its key names; %s (at most %s)",
		c.id, counted(int64(len(v)), "byte"), count(codec.MaxDictionarySize))
	if c.field != c.id {
		s += fmt.Sprintf("; its Dictionary_ID field holds %08x, which readers replace with the id, as zstd --train writes its own", c.field)
	}
	r.Dictionary = s
	if r.TTLMillis >= 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("it expires in %s: FORMAT.md section 3.6 publishes dictionaries with no expiry, and the values that name %08x cannot be read once it is gone (a packcache writer still writing with it publishes it again)", ttlString(r.TTLMillis), c.id))
	}
}

// maxReencode bounds the values inspect re-encodes to find their level.
const maxReencode = 4 << 20

// levelNote says which levels of the value's codec reproduce it (with d,
// the dictionary of a 0x05 value). The format records the codec, not the
// level, so this is the only way to tell; a value written by another
// encoder or version may match none.
func levelNote(k kind, b byte, decoded, stored []byte, d *codec.Dictionary) string {
	const unrecorded = "not recorded in the format"
	switch {
	case k == kindPlain || k == kindEmpty:
		return ""
	case k == kindGzip:
		return unrecorded + " (gzip is read only)"
	case b == codec.HeaderNone:
		return "none has no levels"
	case b == codec.HeaderSnappy:
		return "snappy has no levels"
	case len(decoded) > maxReencode:
		return unrecorded + fmt.Sprintf(" (not re-encoded: over %s)", bytesIEC(maxReencode))
	}
	var match []string
	try := func(label string, c codec.Codec) {
		out, err := codec.AppendValue(nil, c, decoded)
		if err == nil && bytes.Equal(out, stored) {
			match = append(match, label)
		}
	}
	switch b {
	case codec.HeaderLZ4:
		try("lz4 fast (level 0)", codec.LZ4)
		var hc []string
		for l := 1; l <= 9; l++ {
			out, err := codec.AppendValue(nil, codec.LZ4Level(l), decoded)
			if err == nil && bytes.Equal(out, stored) {
				hc = append(hc, fmt.Sprint(l))
			}
		}
		if len(hc) > 0 {
			match = append(match, "lz4hc level "+strings.Join(hc, ", "))
		}
	case codec.HeaderZstd:
		for _, s := range zstdSpeeds {
			try(fmt.Sprintf("zstd %s (levels %s)", s.label, s.levels), codec.ZstdLevel(s.level))
		}
	case codec.HeaderZstdDict:
		for _, s := range zstdSpeeds {
			try(fmt.Sprintf("zstd %s (levels %s) with the dictionary", s.label, s.levels), d.Codec(s.level))
		}
	default:
		return unrecorded
	}
	if len(match) == 0 {
		return unrecorded + "; no level of this build reproduces the stored bytes (another encoder or version wrote it)"
	}
	return unrecorded + "; re-encoding reproduces the stored bytes at " + strings.Join(match, " and ")
}

func printReport(w io.Writer, r *keyReport, raw bool) {
	fmt.Fprintln(w, r.Key)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t%s\n", name, fmt.Sprintf(format, args...))
	}
	defer tw.Flush()
	switch {
	case !r.Exists:
		row("error", "no such key")
		return
	case r.Type != "string":
		row("type", "%s", r.Type)
		row("error", "a %s, not a string: packcache stores strings", r.Type)
		row("ttl", "%s", ttlString(r.TTLMillis))
		row("memory", "%s bytes (MEMORY USAGE)", count(r.MemoryUsage))
		return
	}
	row("type", "string")
	if r.Envelope != nil {
		printEnvelope(row, r.Envelope)
	}
	switch {
	case r.Kind == "dictionary" || r.Kind == "group":
		row("key", "%s", r.Meaning)
	case r.Header != "":
		row("header", "%s %s", r.Header, r.Meaning)
	default:
		row("header", "%s", r.Meaning)
	}
	if r.Level != "" {
		row("level", "%s", r.Level)
	}
	row("stored", "%s", counted(int64(r.Stored), "byte"))
	if r.Decoded != nil {
		if r.Ratio != nil {
			row("decoded", "%s (stored/decoded %.3f)", counted(int64(*r.Decoded), "byte"), *r.Ratio)
		} else {
			row("decoded", "%s", counted(int64(*r.Decoded), "byte"))
		}
	}
	row("ttl", "%s", ttlString(r.TTLMillis))
	row("memory", "%s bytes (MEMORY USAGE)", count(r.MemoryUsage))
	if r.LeaseToken != "" {
		row("token", "%s", r.LeaseToken)
	}
	if r.Dictionary != "" {
		row("dictionary", "%s", r.Dictionary)
	}
	if r.Error != "" {
		row("error", "%s", r.Error)
		row("format", "%s", r.FormatNote)
	}
	for _, n := range r.Notes {
		row("note", "%s", n)
	}
	tw.Flush()
	switch {
	case raw:
		fmt.Fprintln(w, "  value as stored:")
		w.Write(r.stored)
		fmt.Fprintln(w)
	case r.Value != nil:
		var buf bytes.Buffer
		json.Indent(&buf, r.Value, "", "  ")
		fmt.Fprintln(w, "  value:")
		buf.WriteTo(w)
		fmt.Fprintln(w)
	case r.ValueBase64 != nil:
		fmt.Fprintf(w, "  value: %d bytes that are not JSON; --raw prints the value as stored\n", len(r.ValueBase64))
	case r.Kind == "dictionary" && r.Error != "":
		fmt.Fprintf(w, "  value: %s that readers do not take for the dictionary the key names; --raw prints them\n", counted(int64(r.Stored), "byte"))
	case r.Kind == "dictionary":
		fmt.Fprintf(w, "  value: the dictionary's %s, not JSON; --raw prints them (zstd -D reads them, FORMAT.md section 3.6)\n", counted(int64(r.Stored), "byte"))
	}
}
