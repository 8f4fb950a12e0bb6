package codec

import (
	"testing"
	"testing/iotest"
)

func TestHeadReader(t *testing.T) {
	for _, tc := range []struct{ head, rest, want string }{
		{"", "", ""},
		{"ab", "", "ab"},
		{"", "cd", "cd"},
		{"ab", "cdef", "abcdef"},
	} {
		r := &HeadReader{Head: []byte(tc.head), Rest: []byte(tc.rest)}
		if err := iotest.TestReader(r, []byte(tc.want)); err != nil {
			t.Errorf("HeadReader{%q, %q}: %v", tc.head, tc.rest, err)
		}
	}
}
