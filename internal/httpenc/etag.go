package httpenc

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// etag is the strong entity tag of a body: 128 bits of its SHA-256,
// marked with its coding, so that two codings of one value never share
// one (RFC 9110, section 8.8.3).
func etag(b []byte, coding string) string {
	sum := sha256.Sum256(b)
	tag := make([]byte, 0, 2+22+1+len(coding))
	tag = append(tag, '"')
	tag = base64.RawURLEncoding.AppendEncode(tag, sum[:16])
	if coding != "" {
		tag = append(tag, '-')
		tag = append(tag, coding...)
	}
	return string(append(tag, '"'))
}

// etagMatch reports whether an If-None-Match or If-Match field lists tag,
// or is "*" (RFC 9110, section 13.1.2 and 13.1.1): by weak comparison
// (If-None-Match), or, if strong, by strong comparison (If-Match), which a
// weak tag ("W/...") never passes.
func etagMatch(values []string, tag string, strong bool) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "*" || t == tag || !strong && strings.TrimPrefix(t, "W/") == tag {
				return true
			}
		}
	}
	return false
}
