package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/packcache/packcache/codec"
)

// choice is a codec at a level, named as the command line, the
// PACKCACHE_CODEC and PACKCACHE_LEVEL variables and a Policy literal name
// it.
type choice struct {
	name  string // none, lz4, snappy or zstd
	level int    // zstd 1-22, lz4 0 (fast) or 1-9 (HC); 0 for snappy and none
	c     codec.Codec
	dict  *codec.Dictionary // zstd with a dictionary: c is its codec
}

// withDictionary is the zstd choice ch with dictionary d.
func (ch choice) withDictionary(d *codec.Dictionary) choice {
	ch.c, ch.dict = d.Codec(ch.level), d
	return ch
}

// unleveled are the codecs without levels the command line names.
var unleveled = map[string]codec.Codec{
	"none":   codec.None,
	"snappy": codec.Snappy,
}

// leveled are the codecs with levels the command line names: the level
// without --level (the library's default), the range, in numbers and in
// words, and the codec of a level.
var leveled = map[string]struct {
	def, lo, hi int
	levels      string
	codec       func(level int) codec.Codec
}{
	"lz4":  {0, 0, 9, "0 (fast) and 1-9 (HC)", codec.LZ4Level},
	"zstd": {1, 1, 22, "1-22", codec.ZstdLevel},
}

// parseChoice checks a codec name and level from the command line. Without
// a level, zstd is codec.Zstd (level 1) and lz4 is codec.LZ4 (fast), the
// library's own defaults.
func parseChoice(name string, level int, levelSet bool) (choice, error) {
	lower := strings.ToLower(name)
	if c, ok := unleveled[lower]; ok {
		if levelSet {
			return choice{}, usagef("codec %s has no levels; drop --level", lower)
		}
		return choice{name: lower, c: c}, nil
	}
	l, ok := leveled[lower]
	if !ok {
		return choice{}, usagef("unknown codec %q: use none, lz4, snappy or zstd (with --level for lz4 and zstd)", name)
	}
	if !levelSet {
		level = l.def
	}
	if level < l.lo || level > l.hi {
		return choice{}, usagef("%s levels are %s, not %d", lower, l.levels, level)
	}
	return choice{name: lower, level: level, c: l.codec(level)}, nil
}

// zstdSpeeds are the four distinct Zstandard speeds codec.ZstdLevel maps
// the standard levels onto, with the standard level that names each.
var zstdSpeeds = []struct {
	label  string
	level  int
	levels string
}{
	{"fastest", 1, "1-2"},
	{"default", 3, "3-5"},
	{"better", 7, "6-9"},
	{"best", 11, "10-22"},
}

// String names the choice for tables: "zstd 3 (default)", "lz4 fast",
// "lz4hc 9", "snappy", "none".
func (ch choice) String() string {
	switch ch.name {
	case "lz4":
		if ch.level == 0 {
			return "lz4 fast"
		}
		return fmt.Sprintf("lz4hc %d", ch.level)
	case "zstd":
		dict := ""
		if ch.dict != nil {
			dict = fmt.Sprintf(" + dict %08x", ch.dict.ID())
		}
		for _, s := range zstdSpeeds {
			if codec.ZstdLevel(s.level) == codec.ZstdLevel(ch.level) {
				return fmt.Sprintf("zstd %d (%s)%s", ch.level, s.label, dict)
			}
		}
	}
	return ch.name
}

// goExpr is the choice as Go source using the codec package's exported
// names.
func (ch choice) goExpr() string {
	switch ch.name {
	case "none":
		return "codec.None"
	case "snappy":
		return "codec.Snappy"
	case "lz4":
		if ch.level == 0 {
			return "codec.LZ4"
		}
		return fmt.Sprintf("codec.LZ4Level(%d)", ch.level)
	}
	return fmt.Sprintf("codec.ZstdLevel(%d)", ch.level)
}

// target is a write policy: a codec and the size above which values are
// compressed.
type target struct {
	choice
	// above is the serialized size in bytes at or below which values are
	// stored plain; 0 compresses every non-empty value; never, as set by
	// "off", is math.MaxInt.
	above int
}

const never = math.MaxInt

// minSaving is the library's default Policy.MinSaving: a compressed form
// is stored only if it is at least this many bytes smaller than the plain
// form.
const minSaving = 1

// defaultCompressAbove is the library's (1024).
const defaultCompressAbove = 1024

// parseAbove reads --compress-above: bytes, or "off".
func parseAbove(s string) (int, error) {
	if strings.EqualFold(s, "off") {
		return never, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, usagef("--compress-above takes a size in bytes (0 or more) or off, not %q", s)
	}
	return n, nil
}

// store appends to dst what a packcache writer with policy t stores for the
// serialized value v, as the library's write path does: compress a value
// longer than the threshold, and keep the compressed form only if it saves
// minSaving bytes over the plain form. The plain form is v itself when text
// (v is JSON, which a text serializer may store verbatim) and v does not
// begin with a header byte; otherwise it is v framed with 01 (FORMAT.md
// section 5).
func (t target) store(dst, v []byte, text bool) ([]byte, error) {
	verbatim := text && codec.Plain(v)
	plainLen := len(v)
	if !verbatim {
		plainLen++
	}
	if len(v) > 0 && len(v) > t.above && t.c.ID() != codec.HeaderNone {
		out, err := codec.AppendValue(dst, t.c, v)
		if err != nil {
			return dst, err
		}
		if len(out)-len(dst)+minSaving <= plainLen {
			return out, nil
		}
		dst = out[:len(dst)]
	}
	if verbatim {
		return append(dst, v...), nil
	}
	return codec.AppendValue(dst, codec.None, v)
}

// policyLiteral is t as a packcache.Policy literal. Zero fields inherit in
// a Policy, so compressing every value needs packcache.CompressAll.
func (t target) policyLiteral() string {
	if t.c.ID() == codec.HeaderNone || t.above == never {
		return "packcache.Policy{Codec: codec.None}"
	}
	above := strconv.Itoa(t.above)
	if t.above == 0 {
		above = "packcache.CompressAll"
	}
	if t.dict != nil {
		// dict: the dictionary's bytes, from the file advise --train wrote.
		return fmt.Sprintf("packcache.Policy{Codec: %s, CompressAbove: %s, Dictionary: dict}", t.goExpr(), above)
	}
	return fmt.Sprintf("packcache.Policy{Codec: %s, CompressAbove: %s}", t.goExpr(), above)
}

// envVars is t as the environment variables the library reads for prefix
// (all prefixes when prefix is empty), in the default PACKCACHE namespace.
func (t target) envVars(prefix string) []string {
	ns := "PACKCACHE_"
	if prefix != "" {
		ns += "PREFIX_" + envName(prefix) + "_"
	}
	if t.c.ID() == codec.HeaderNone || t.above == never {
		return []string{ns + "CODEC=none"}
	}
	vars := []string{ns + "CODEC=" + t.name}
	if t.name == "zstd" || t.name == "lz4" {
		vars = append(vars, ns+"LEVEL="+strconv.Itoa(t.level))
	}
	vars = append(vars, ns+"COMPRESS_ABOVE="+strconv.Itoa(t.above))
	if t.dict != nil {
		vars = append(vars, "# no variable sets the dictionary: Policy.Dictionary, in the code, does")
	}
	return vars
}

// envName turns a key prefix into the NAME of PACKCACHE_PREFIX_<NAME>_...:
// upper-cased, every run of bytes outside [A-Z0-9] replaced by one _, and
// leading and trailing _ trimmed. "report:monthly:" is REPORT_MONTHLY.
func envName(prefix string) string {
	var b strings.Builder
	under := false
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			if under && b.Len() > 0 {
				b.WriteByte('_')
			}
			under = false
			b.WriteByte(c)
			continue
		}
		under = true
	}
	return b.String()
}
