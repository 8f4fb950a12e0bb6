package packcache

import (
	"errors"
	"testing"
)

// TestMovedTo: the address a MOVED reply names, and nothing for other
// replies (ASK is a migration in progress, not a new owner).
func TestMovedTo(t *testing.T) {
	for _, c := range []struct{ reply, want string }{
		{"MOVED 16002 127.0.0.1:37465", "127.0.0.1:37465"},
		{"MOVED 3999 redis-2.example:6380", "redis-2.example:6380"},
		{"ASK 16002 127.0.0.1:37465", ""},
		{"CLUSTERDOWN The cluster is down", ""},
		{"MOVED 16002", ""},
	} {
		if got := movedTo(errors.New(c.reply)); got != c.want {
			t.Errorf("movedTo(%q) = %q, want %q", c.reply, got, c.want)
		}
	}
}
