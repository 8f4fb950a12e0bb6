package httpenc

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestETag: a strong entity tag, 128 bits of the bytes' hash, the same for
// the same bytes and coding, and another for other bytes or another
// coding.
func TestETag(t *testing.T) {
	body := []byte(`{"id":"a"}`)
	for _, coding := range []string{"", "gzip", "zstd"} {
		tag := etag(body, coding)
		if tag != etag(append([]byte(nil), body...), coding) {
			t.Errorf("%q: two tags for the same bytes", coding)
		}
		if len(tag) < 2 || tag[0] != '"' || tag[len(tag)-1] != '"' || strings.HasPrefix(tag, "W/") {
			t.Fatalf("%q: %s is not a strong entity tag", coding, tag)
		}
		hash, marked, _ := strings.Cut(tag[1:len(tag)-1], "-")
		if marked != coding {
			t.Errorf("%s: marked %q, want %q", tag, marked, coding)
		}
		if b, err := base64.RawURLEncoding.DecodeString(hash); err != nil || len(b) != 16 {
			t.Errorf("%s: hash of %d bytes (%v), want 16", tag, len(b), err)
		}
		// etagc = "!" / %x23-7E / obs-text: no quote, no space, no control.
		for _, r := range tag[1 : len(tag)-1] {
			if r == '"' || r <= ' ' || r == 0x7f {
				t.Errorf("%s: %q is not an etagc", tag, r)
			}
		}
	}
	tags := map[string]bool{}
	for _, tag := range []string{etag(body, ""), etag(body, "gzip"), etag(body, "zstd"), etag([]byte(`{"id":"b"}`), ""), etag(nil, "")} {
		if tags[tag] {
			t.Errorf("%s given twice", tag)
		}
		tags[tag] = true
	}
}

// TestETagMatch: If-None-Match by weak comparison, in any of the forms it
// may take.
func TestETagMatch(t *testing.T) {
	const tag = `"abc-gzip"`
	for _, tc := range []struct {
		values []string
		want   bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{tag}, true},
		{[]string{"W/" + tag}, true},
		{[]string{`"other", ` + tag}, true},
		{[]string{`"other",` + tag + `,"more"`}, true},
		{[]string{" " + tag + " "}, true},
		{[]string{`"other"`, tag}, true}, // two field values
		{[]string{"*"}, true},
		{[]string{`"other"`}, false},
		{[]string{`"abc"`}, false},        // the same value in another coding
		{[]string{`"abc-gzip`}, false},    // unquoted
		{[]string{`W/"abc"-gzip`}, false}, // not a tag
		{[]string{`"ABC-GZIP"`}, false},   // tags are case-sensitive
	} {
		if got := etagMatch(tc.values, tag, false); got != tc.want {
			t.Errorf("If-None-Match %q: %v, want %v", tc.values, got, tc.want)
		}
	}
}
