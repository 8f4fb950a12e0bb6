package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/packcache/packcache/codec"
)

// Groups (FORMAT.md section 2.4): one sequence and one record per group,
// all under one hash tag, so in one slot of a Cluster.
const (
	groupTag    = "{packcache:g}"
	groupSeqKey = groupTag + "seq"
	groupPrefix = groupTag + ":"
)

// invalidateScript invalidates groups as FORMAT.md section 2.4 says (and
// as packcache's InvalidateGroups does): KEYS[1] is the sequence, the
// others the groups' records. It increments the sequence (remade, when
// Redis lost it and INCR makes it 1, from the server's clock in
// microseconds, never begun again from 0: FORMAT.md) and deletes the
// records, and returns the new sequence, then each record's sequence
// before its deletion (false: it had none).
var invalidateScript = redis.NewScript(`
local out = {redis.call('INCR', KEYS[1])}
if out[1] == 1 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[1], t[1] .. string.format('%06d', tonumber(t[2])))
  out[1] = redis.call('INCR', KEYS[1])
end
for i = 2, #KEYS do
  out[i] = redis.call('GET', KEYS[i])
  redis.call('DEL', KEYS[i])
end
return out`)

func newInvalidateCmd(cf *connFlags) *cobra.Command {
	var groups []string
	cmd := &cobra.Command{
		Use:   "invalidate --group NAME...",
		Short: "Invalidate every value stored in groups, at once, whatever their number",
		Long: `invalidate invalidates every value that packcache stored in the groups named by
--group (InGroups, StoreWith), as the library's InvalidateGroups does: one script on
the groups' slot (hash tag {packcache:g}) increments the group sequence and deletes the
groups' records (FORMAT.md section 2.4). It lists, scans and reads no member, so it
costs the same for a group of ten keys or of ten million. From then on no packcache
reader serves a value stored in those groups before, in any process (a near cache
within its MaxLag); values stored afterwards are served as usual.

--group NAME names a group, exactly as the application spelt it; repeat it for several.
A group with no record (nothing stored in it since its last invalidation, or its
record expired with its values) is reported as such: there was nothing to invalidate.

invalidate writes, so it needs its server named: --addr (with --cluster, the seeds),
--url, $PACKCACHE_ADDR or $PACKCACHE_URL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(groups) == 0 {
				return usagef("invalidate needs at least one --group NAME")
			}
			c, err := cf.connect(cmd.Context(), "invalidate", cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			return invalidate(cmd.Context(), c, groups, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringArrayVar(&groups, "group", nil, "a `NAME` of a group to invalidate (repeat it for several)")
	return cmd
}

// invalidate invalidates groups with one script, and says what each
// group's record was.
func invalidate(ctx context.Context, c *conn, groups []string, w io.Writer) error {
	var names []string
	for _, g := range groups {
		if !slices.Contains(names, g) {
			names = append(names, g)
		}
	}
	keys := []string{groupSeqKey}
	for _, g := range names {
		keys = append(keys, groupPrefix+g)
	}
	out, err := invalidateScript.Run(ctx, c.rdb, keys).Slice()
	if err != nil {
		return fmt.Errorf("invalidating %s: %w", strings.Join(names, ", "), err)
	}
	if len(out) != len(keys) {
		return fmt.Errorf("invalidating %s: unexpected reply %v", strings.Join(names, ", "), out)
	}
	fmt.Fprintf(w, "group sequence now %v\n", out[0])
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, g := range names {
		switch rec := out[i+1].(type) {
		case string:
			fmt.Fprintf(tw, "  %s\tinvalidated: its record, made at sequence %s, deleted\n", g, rec)
		default:
			fmt.Fprintf(tw, "  %s\tno record: nothing stored in it since its last invalidation, or expired; nothing to invalidate\n", g)
		}
	}
	return tw.Flush()
}

// envelopeReport is what inspect finds in a value's envelope (FORMAT.md
// section 2.4), and the state of its groups in Redis.
type envelopeReport struct {
	FieldsBytes int           `json:"fields_bytes"`           // the envelope's own bytes: header, length, fields
	Seq         *uint64       `json:"sequence,omitempty"`     // the group sequence its writer read
	Groups      []groupReport `json:"groups,omitempty"`       // in the envelope's order
	OwnTTL      int64         `json:"own_ttl_ms,omitempty"`   // the TTL the writer chose (StoreWith, SetTTL), in ms
	SeqNow      *uint64       `json:"sequence_now,omitempty"` // the group sequence in Redis now
	Current     bool          `json:"current"`                // every group current: readers serve it
}

// groupReport is the state of one group of a value.
type groupReport struct {
	Name   string  `json:"name"`
	Record *uint64 `json:"record,omitempty"` // the group's record in Redis; nil: none
	State  string  `json:"state"`            // current, invalidated
	Why    string  `json:"why"`
}

// inspectEnvelope fills r for v, a value in an envelope, and returns the
// value the envelope holds, to be inspected as any value; nil when the
// envelope is malformed (r says why).
func inspectEnvelope(ctx context.Context, c *conn, r *keyReport, v []byte) ([]byte, error) {
	env, inner, err := codec.ParseEnvelope(v)
	if err != nil {
		r.Header, r.Kind = fmt.Sprintf("0x%02x", v[0]), "envelope"
		r.Meaning = envelopeMeaning
		r.failed, r.Error = true, err.Error()
		r.FormatNote = `FORMAT.md section 2.4: "A reader meeting a tag it does not know reports an unknown header (the value was written by a newer writer: kept, never deleted); a length that runs past the value, a repeated tag, a group count of 0, bytes left over in the groups field, a TTL of 0, or a lease or an envelope as V' are corrupt."`
		return nil, nil
	}
	e := &envelopeReport{FieldsBytes: len(v) - len(inner), OwnTTL: env.TTL.Milliseconds(), Current: true}
	r.Envelope = e
	if env.Groups == nil {
		return inner, nil
	}
	seq := env.Seq
	e.Seq = &seq
	pipe := c.rdb.Pipeline()
	now := pipe.Get(ctx, groupSeqKey)
	recs := make([]*redis.StringCmd, len(env.Groups))
	for i, g := range env.Groups {
		recs[i] = pipe.Get(ctx, groupPrefix+g)
	}
	pipe.Exec(ctx) // each command carries its own error
	if n, err := readSeq(now); err != nil {
		return nil, fmt.Errorf("GET %s: %w", groupSeqKey, err)
	} else {
		e.SeqNow = &n
	}
	for i, g := range env.Groups {
		gr := groupReport{Name: g, State: "current"}
		n, err := readSeq(recs[i])
		switch {
		case err == redis.Nil:
			gr.State, gr.Why = "invalidated", "no record: the group was invalidated since the value was stored, or its record expired"
		case err != nil:
			return nil, fmt.Errorf("GET %s: %w", groupPrefix+g, err)
		case n > seq:
			gr.Record = &n
			gr.State, gr.Why = "invalidated", fmt.Sprintf("its record was made anew at sequence %d, after the value's %d: the group was invalidated since", n, seq)
		default:
			gr.Record = &n
			gr.Why = fmt.Sprintf("its record, made at sequence %d, is no later than the value's %d", n, seq)
		}
		if gr.State != "current" {
			e.Current = false
		}
		e.Groups = append(e.Groups, gr)
	}
	if !e.Current {
		r.Notes = append(r.Notes, "a group of this value was invalidated: readers treat it as a miss (a loader stores over it)")
	}
	return inner, nil
}

// readSeq reads a sequence or a record: absent is redis.Nil, except for
// the sequence itself, shown as 0 when absent (a writer remakes it from
// the clock before using it).
func readSeq(cmd *redis.StringCmd) (uint64, error) {
	s, err := cmd.Result()
	if err == redis.Nil && cmd.Args()[1] == groupSeqKey {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a sequence: %w", s, err)
	}
	return n, nil
}

const envelopeMeaning = "envelope: a value in groups, or with a TTL of its own (FORMAT.md section 2.4)"

// clockSeq is the least group sequence read as made from a clock (a
// lost sequence is remade as the server's clock in microseconds: 2001 on):
// below, it counts invalidations.
const clockSeq = 1_000_000_000_000_000

// isGroupKey reports whether key is one of the groups' keys: the
// sequence or a group's record.
func isGroupKey(key string) bool { return strings.HasPrefix(key, groupTag) }

// inspectGroupKey fills r for v, the value of key, one of the groups'
// keys.
func inspectGroupKey(ctx context.Context, c *conn, r *keyReport, key string, v []byte) error {
	r.Kind = "group"
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		r.failed = true
		r.Error = fmt.Sprintf("%q is not a sequence", v)
		r.FormatNote = "FORMAT.md section 2.4: the group sequence and each group's record hold an integer."
	}
	if key == groupSeqKey {
		r.Meaning = "the group sequence (FORMAT.md section 2.4): incremented by every invalidation of any group; it has no expiry"
		switch {
		case err != nil:
		case n < clockSeq:
			r.Notes = append(r.Notes, fmt.Sprintf("%s so far", counted(int64(n), "invalidation")))
		default:
			r.Notes = append(r.Notes, fmt.Sprintf("made from the server's clock (%s, in microseconds), when first needed or after Redis lost it, plus one per invalidation since",
				time.UnixMicro(int64(n)).UTC().Format(time.RFC3339)))
		}
		return nil
	}
	g, ok := strings.CutPrefix(key, groupPrefix)
	if !ok {
		r.Meaning = "a key under the groups' hash tag " + groupTag + " that packcache does not write"
		return nil
	}
	r.Meaning = fmt.Sprintf("the record of group %q (FORMAT.md section 2.4): made by the first write into the group since its last invalidation; invalidate --group deletes it", g)
	if err != nil {
		return nil
	}
	now, err := readSeq(c.rdb.Get(ctx, groupSeqKey))
	if err != nil {
		return fmt.Errorf("GET %s: %w", groupSeqKey, err)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("made at sequence %d (the sequence is now %d): the group's values stored with a sequence of %d or more are current", n, now, n))
	return nil
}

// printEnvelope prints the rows of r's envelope.
func printEnvelope(row func(name, format string, args ...any), e *envelopeReport) {
	row("envelope", "0x0b, %s of fields (FORMAT.md section 2.4)", counted(int64(e.FieldsBytes), "byte"))
	if e.OwnTTL > 0 {
		row("own ttl", "%s, chosen by its writer (StoreWith or SetTTL)", ttlString(e.OwnTTL))
	}
	if e.Seq == nil {
		return
	}
	row("sequence", "%d when it was written; %d now", *e.Seq, *e.SeqNow)
	for _, g := range e.Groups {
		row("group", "%s: %s (%s)", g.Name, g.State, g.Why)
	}
	if e.Current {
		row("groups", "all current: readers serve it")
	} else {
		row("groups", "invalidated: readers treat it as a miss")
	}
}
