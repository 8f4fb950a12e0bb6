package httpenc

import "testing"

// TestParseAcceptEncoding: the q-value each coding gets, in thousandths,
// from the field values of a request (nil: no Accept-Encoding).
func TestParseAcceptEncoding(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   accepted // zstd, gzip, identity
	}{
		{nil, accepted{0, 0, 1000}},                                    // no field: identity only
		{[]string{""}, accepted{0, 0, 1}},                              // an empty field: identity, least wanted
		{[]string{"zstd"}, accepted{1000, 0, 1}},                       // identity acceptable but after every coding named
		{[]string{"gzip, deflate, br, zstd"}, accepted{1000, 1000, 1}}, // Chromium's
		{[]string{"x-gzip"}, accepted{0, 1000, 1}},
		{[]string{"GZIP"}, accepted{0, 1000, 1}},
		{[]string{"ZsTd"}, accepted{1000, 0, 1}},
		{[]string{"br"}, accepted{0, 0, 1}},
		{[]string{"identity"}, accepted{0, 0, 1000}},
		{[]string{"zstd;q=0, gzip"}, accepted{0, 1000, 1}},
		{[]string{"zstd;q=0", "gzip;q=0"}, accepted{0, 0, 1}}, // two field values
		{[]string{"zstd; q=0.000"}, accepted{0, 0, 1}},
		{[]string{"zstd;q=0.5, gzip;q=0.8"}, accepted{500, 800, 1}},
		{[]string{"zstd;q=0.5, identity"}, accepted{500, 0, 1000}},
		{[]string{"zstd;q=1.0, identity"}, accepted{1000, 0, 1000}},
		{[]string{"zstd ; Q = 0.25 , gzip"}, accepted{250, 1000, 1}},
		{[]string{"zstd;level=3;q=0.1"}, accepted{100, 0, 1}}, // other parameters are passed over
		{[]string{"zstd;q=2, gzip"}, accepted{0, 1000, 1}},    // a malformed q: the element is ignored
		{[]string{"zstd;q=abc, gzip"}, accepted{0, 1000, 1}},
		{[]string{"zstd;q=0.5, zstd;q=0.9"}, accepted{900, 0, 1}}, // named twice: the higher q
		{[]string{"*"}, accepted{1000, 1000, 1000}},
		{[]string{"*;q=0.5, gzip"}, accepted{500, 1000, 500}},
		{[]string{"*;q=0, gzip"}, accepted{0, 1000, 0}},
		{[]string{"gzip;q=0, *"}, accepted{1000, 0, 1000}},
		{[]string{"identity;q=0, gzip"}, accepted{0, 1000, 0}},
		{[]string{"identity;q=0"}, accepted{0, 0, 0}},
		{[]string{"*;q=0"}, accepted{0, 0, 0}},
		{[]string{"br, identity;q=0"}, accepted{0, 0, 0}},
	} {
		if got := parseAcceptEncoding(tc.values); got != tc.want {
			t.Errorf("Accept-Encoding %q: %v, want %v", tc.values, got, tc.want)
		}
	}
}

// TestQValue: the q parameter in thousandths, by RFC 9110's grammar
// (section 12.4.2); anything else is malformed.
func TestQValue(t *testing.T) {
	for _, tc := range []struct {
		params string
		q      int
		ok     bool
	}{
		{"", 1000, true},
		{"level=1", 1000, true},
		{"q=1", 1000, true},
		{"q=1.", 1000, true},
		{"q=1.000", 1000, true},
		{"q=0", 0, true},
		{"q=0.", 0, true},
		{"q=0.5", 500, true},
		{"q=0.05", 50, true},
		{"q=0.005", 5, true},
		{"q=0.999", 999, true},
		{" Q = 0.7 ", 700, true},
		{"a=b; q=0.3", 300, true},
		{"q=1.001", 0, false},
		{"q=1.5", 0, false},
		{"q=2", 0, false},
		{"q=0.0001", 0, false},
		{"q=", 0, false},
		{"q=.5", 0, false},
		{"q=05", 0, false},
		{"q=0,5", 0, false},
		{"q=0.5x", 0, false},
		{"q=-0", 0, false},
		{"q=abc", 0, false},
	} {
		q, ok := qValue(tc.params)
		if q != tc.q || ok != tc.ok {
			t.Errorf("qValue(%q) = %d, %v; want %d, %v", tc.params, q, ok, tc.q, tc.ok)
		}
	}
}

// TestOrder: codings by q, highest first, zstd before gzip before
// identity among equals, and those at q=0 left out.
func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		a    accepted
		want []int
	}{
		{accepted{1000, 1000, 1000}, []int{codingZstd, codingGzip, codingIdentity}},
		{accepted{500, 800, 1}, []int{codingGzip, codingZstd, codingIdentity}},
		{accepted{1, 1, 1000}, []int{codingIdentity, codingZstd, codingGzip}},
		{accepted{0, 1000, 1}, []int{codingGzip, codingIdentity}},
		{accepted{700, 0, 700}, []int{codingZstd, codingIdentity}},
		{accepted{0, 0, 1000}, []int{codingIdentity}},
		{accepted{0, 0, 0}, []int{}},
	} {
		order, n := tc.a.order()
		got := order[:n]
		if len(got) != len(tc.want) {
			t.Errorf("%v: order %v, want %v", tc.a, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%v: order %v, want %v", tc.a, got, tc.want)
				break
			}
		}
	}
}
