package httpenc

import (
	"iter"
	"strings"
)

// accepted holds the q-values, in thousandths, that a request's
// Accept-Encoding gives the codings Serve sends, by coding.
type accepted [codings]int

// parseAcceptEncoding reads the Accept-Encoding field values of a request
// (RFC 9110, section 12.5.3). Without the field, only identity is
// accepted: a client that says nothing may not decode anything else.
// A coding not named takes the q of "*" if given, else 0, but identity,
// which is acceptable unless refused: it then comes after every coding
// named. "x-gzip" is gzip.
func parseAcceptEncoding(values []string) accepted {
	if values == nil {
		return accepted{codingIdentity: 1000}
	}
	a := accepted{-1, -1, -1}
	star := -1
	for name, q := range acceptElems(values) {
		switch {
		case strings.EqualFold(name, "zstd"):
			a[codingZstd] = max(a[codingZstd], q)
		case strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"):
			a[codingGzip] = max(a[codingGzip], q)
		case strings.EqualFold(name, "identity"):
			a[codingIdentity] = max(a[codingIdentity], q)
		case name == "*":
			star = max(star, q)
		}
	}
	for _, k := range [...]int{codingZstd, codingGzip} {
		if a[k] < 0 {
			a[k] = max(star, 0)
		}
	}
	if a[codingIdentity] < 0 {
		// Acceptable unless refused, but the least wanted: "gzip;q=0.5"
		// asks for gzip.
		a[codingIdentity] = 1
		if star >= 0 {
			a[codingIdentity] = star
		}
	}
	return a
}

// acceptsDcz reports whether the Accept-Encoding field values of a
// request name dcz with a q-value above 0. Only a client that names it
// gets it: "*" does not stand for dcz, which also needs a dictionary the
// client says it has (see Delta).
func acceptsDcz(values []string) bool {
	for name, q := range acceptElems(values) {
		if q > 0 && strings.EqualFold(name, "dcz") {
			return true
		}
	}
	return false
}

// acceptElems yields the codings of Accept-Encoding field values, each
// with its q-value in thousandths; an element with a malformed q is left
// out.
func acceptElems(values []string) iter.Seq2[string, int] {
	return func(yield func(string, int) bool) {
		for _, v := range values {
			for elem := range strings.SplitSeq(v, ",") {
				name, params, _ := strings.Cut(elem, ";")
				q, ok := qValue(params)
				if !ok {
					continue // a malformed q: ignore the element
				}
				if !yield(strings.TrimSpace(name), q) {
					return
				}
			}
		}
	}
}

// qValue returns the q parameter among params ("; q=0.5"), in
// thousandths: 1000 without one, and false if it is malformed.
func qValue(params string) (int, bool) {
	q := 1000
	for p := range strings.SplitSeq(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		v = strings.TrimSpace(v)
		// qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
		if v == "" || v[0] != '0' && v[0] != '1' || len(v) > 5 || len(v) > 1 && v[1] != '.' {
			return 0, false
		}
		q = int(v[0]-'0') * 1000
		for i, scale := 2, 100; i < len(v); i, scale = i+1, scale/10 {
			if v[i] < '0' || v[i] > '9' {
				return 0, false
			}
			q += int(v[i]-'0') * scale
		}
		if q > 1000 {
			return 0, false
		}
	}
	return q, true
}

// order returns the codings a accepts, most wanted first and, among
// equals, the one whose body is smaller (zstd, gzip, identity), and how
// many there are: order[:n].
func (a accepted) order() (order [codings]int, n int) {
	order = [codings]int{codingZstd, codingGzip, codingIdentity}
	for i := 1; i < codings; i++ {
		for j := i; j > 0 && a[order[j]] > a[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	for n < codings && a[order[n]] > 0 {
		n++
	}
	return order, n
}
