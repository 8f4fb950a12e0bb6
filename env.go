package packcache

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/packcache/packcache/codec"
)

// WithEnv lets operators override, through environment variables and
// without a code change, the codec, level, compression threshold and TTL
// of the cache's base policy and of each prefix the code declares with
// WithPrefix. namespace begins every variable's name; "" means
// "PACKCACHE". The variables, read once in New, whatever the order of the
// options:
//
//	PACKCACHE_CODEC           none, lz4, snappy, zstd, or a registered user codec's name
//	PACKCACHE_LEVEL           zstd: 1 to 22 (zstd's levels); lz4: 0 (fast) or 1 to 9 (HC)
//	PACKCACHE_COMPRESS_ABOVE  bytes (values at or below are stored plain; 0 compresses all), or off
//	PACKCACHE_TTL             a Go duration (10m, 36h) of at least 1ms, or none
//
// and, for a prefix, the same four after PACKCACHE_PREFIX_<NAME>_, where
// NAME is the prefix upper-cased with every run of characters other than
// A-Z and 0-9 replaced by one underscore and trimmed of underscores at
// either end: "channel:" is CHANNEL, "report:monthly:" is REPORT_MONTHLY.
// So PACKCACHE_PREFIX_CHANNEL_CODEC=lz4 makes the keys under "channel:"
// use LZ4.
//
// A LEVEL without a CODEC applies to the codec the code chose. A value
// that is not valid, a level for a codec without levels, a variable naming
// a prefix the code does not declare, a near miss of a variable's name
// (PACKCACHE_TLL, PACKCACHE_CODECS; within one edit for names of up to
// five letters, two for longer ones), and two prefixes with the same NAME
// all fail New with an error naming the variable. Other variables of the
// namespace, such as an application's own PACKCACHE_TLS, are left alone.
// Variables are
// overrides: what they do not set keeps the code's setting. `packcache
// advise` prints the variables for its recommendation.
func WithEnv(namespace string) Option {
	return func(cfg *config) error {
		if namespace == "" {
			namespace = "PACKCACHE"
		}
		if envName(namespace) != namespace {
			return fmt.Errorf("WithEnv: namespace %q is not of the form [A-Z0-9_]", namespace)
		}
		cfg.envNamespace = namespace
		return nil
	}
}

// envErr adds to an error in a policy the variables that changed it.
func (cfg *config) envErr(prefix string, err error) error {
	if vars := cfg.envSet[prefix]; len(vars) > 0 {
		return fmt.Errorf("%w (with %s)", err, strings.Join(vars, ", "))
	}
	return err
}

// envName turns a prefix into the NAME of its variables.
func envName(prefix string) string {
	var b strings.Builder
	sep := false
	for _, r := range strings.ToUpper(prefix) {
		if r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			if sep && b.Len() > 0 {
				b.WriteByte('_')
			}
			sep = false
			b.WriteRune(r)
		} else {
			sep = true
		}
	}
	return b.String()
}

var envFields = []string{"CODEC", "LEVEL", "COMPRESS_ABOVE", "TTL"}

// applyEnv overrides cfg's base policy and prefixes from the environment,
// as WithEnv describes.
func (cfg *config) applyEnv() error {
	ns := cfg.envNamespace
	if ns == "" {
		return nil
	}
	names := map[string]string{} // NAME -> prefix
	for prefix := range cfg.prefixes {
		n := envName(prefix)
		if other, dup := names[n]; dup {
			return fmt.Errorf("WithEnv: prefixes %q and %q both have the variables %s_PREFIX_%s_*", other, prefix, ns, n)
		}
		names[n] = prefix
	}
	// A variable the operator believes changes something, but which does
	// nothing, is a mistake worth failing on: a prefix the code does not
	// declare, a field that does not exist, a misspelt name.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if err := checkEnvName(ns, k, names); err != nil {
			return err
		}
	}
	cfg.envSet = map[string][]string{}
	if err := overridePolicy(&cfg.base, cfg.base.Codec, ns+"_"); err != nil {
		return err
	}
	cfg.envSet[""] = setVars(ns + "_")
	for n, prefix := range names {
		p := cfg.prefixes[prefix]
		current := p.Codec
		if current == nil {
			current = cfg.base.Codec
		}
		if err := overridePolicy(&p, current, ns+"_PREFIX_"+n+"_"); err != nil {
			return err
		}
		cfg.prefixes[prefix] = p
		cfg.envSet[prefix] = append(setVars(ns+"_PREFIX_"+n+"_"), cfg.envSet[""]...)
	}
	return nil
}

// checkEnvName reports a variable under the namespace that would be
// ignored though it looks meant for the cache. Variables of the namespace
// that look like nothing of the cache's (PACKCACHE_REQUIRE_REDIS, say)
// are left alone.
func checkEnvName(ns, k string, names map[string]string) error {
	rest, ok := strings.CutPrefix(k, ns+"_")
	if !ok {
		return nil
	}
	if p, ok := strings.CutPrefix(rest, "PREFIX_"); ok {
		for _, f := range envFields {
			if n, ok := strings.CutSuffix(p, "_"+f); ok {
				if _, known := names[n]; !known {
					return fmt.Errorf("%s: no prefix of this cache is named %s (declared: %s)", k, n, strings.Join(slices.Sorted(mapKeys(names)), ", "))
				}
				return nil
			}
		}
		return fmt.Errorf("%s: not a variable of WithEnv: a prefix's variables end in _%s", k, strings.Join(envFields, ", _"))
	}
	if slices.Contains(envFields, rest) {
		return nil
	}
	for _, f := range append(envFields, "PREFIX") {
		// Two edits turn TTL into TLS or URL and CODEC into MODE, names an
		// application may well use for itself: short fields allow one.
		maxEdits := 2
		if len(f) <= 5 {
			maxEdits = 1
		}
		if editDistance(rest, f) <= maxEdits || (len(rest) > len(f) && strings.HasPrefix(rest, f)) {
			return fmt.Errorf("%s: not a variable of WithEnv; did you mean %s_%s?", k, ns, f)
		}
	}
	return nil
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// overridePolicy sets p's fields from the variables beginning with pre;
// current is the codec the code chose, to which a lone LEVEL applies.
func overridePolicy(p *Policy, current codec.Codec, pre string) error {
	name, hasCodec := os.LookupEnv(pre + "CODEC")
	level, hasLevel := os.LookupEnv(pre + "LEVEL")
	if hasCodec || hasLevel {
		family := current.Name()
		if hasCodec {
			family = strings.ToLower(strings.TrimSpace(name))
		}
		c, err := codecFor(family, strings.TrimSpace(level), hasLevel)
		if err != nil {
			v := pre + "CODEC"
			if !hasCodec || (hasLevel && !errors.Is(err, errUnknownCodec)) {
				v = pre + "LEVEL"
			}
			return fmt.Errorf("%s: %w", v, err)
		}
		p.Codec = c
	}
	if v, ok := os.LookupEnv(pre + "COMPRESS_ABOVE"); ok {
		v = strings.TrimSpace(v)
		switch n, err := strconv.Atoi(v); {
		case strings.EqualFold(v, "off"):
			p.CompressAbove = Off
		case err != nil || n < 0:
			return fmt.Errorf("%s: %q is neither a number of bytes nor off", pre+"COMPRESS_ABOVE", v)
		case n == 0:
			p.CompressAbove = CompressAll
		default:
			p.CompressAbove = n
		}
	}
	if v, ok := os.LookupEnv(pre + "TTL"); ok {
		v = strings.TrimSpace(v)
		if strings.EqualFold(v, "none") {
			p.TTL = Off
		} else {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Millisecond {
				return fmt.Errorf("%s: %q is neither a duration of at least 1ms nor none", pre+"TTL", v)
			}
			p.TTL = d
		}
	}
	return nil
}

// setVars returns the variables among pre's fields that are set, as
// NAME=value, for error messages.
func setVars(pre string) []string {
	var out []string
	for _, f := range envFields {
		if v, ok := os.LookupEnv(pre + f); ok {
			out = append(out, pre+f+"="+v)
		}
	}
	return out
}

var errUnknownCodec = errors.New("unknown codec")

// codecFor returns the codec named family at level.
func codecFor(family, level string, hasLevel bool) (codec.Codec, error) {
	n := 0
	if hasLevel {
		var err error
		if n, err = strconv.Atoi(level); err != nil {
			return nil, fmt.Errorf("level %q is not a whole number", level)
		}
	}
	switch family {
	case "zstd":
		if !hasLevel {
			return codec.Zstd, nil
		}
		if n < 1 || n > 22 {
			return nil, fmt.Errorf("zstd level %d is not in 1 to 22", n)
		}
		return codec.ZstdLevel(n), nil
	case "lz4":
		if n < 0 || n > 9 {
			return nil, fmt.Errorf("lz4 level %d is not in 0 to 9", n)
		}
		return codec.LZ4Level(n), nil
	case "snappy", "none":
		if hasLevel {
			return nil, fmt.Errorf("%s has no levels", family)
		}
		if family == "none" {
			return codec.None, nil
		}
		return codec.Snappy, nil
	}
	for id := codec.FirstUserHeader; id <= codec.LastUserHeader; id++ {
		if c, ok := codec.Lookup(id); ok && c.Name() == family {
			if hasLevel {
				return nil, fmt.Errorf("user codec %s has no levels here", family)
			}
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w %q: want none, lz4, snappy, zstd or a registered codec's name", errUnknownCodec, family)
}
