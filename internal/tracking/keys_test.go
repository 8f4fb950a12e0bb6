package tracking

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestProbe: a server with CLIENT renamed away, or an ACL without
// client|tracking, is a *RefusedError quoting its reply; a server that
// accepts tracking, and one that cannot be reached, are not.
func TestProbe(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	renamed := server(t, "--rename-command", "CLIENT", "client-renamed-away")
	acl := server(t, "--user", "notrack", "on", ">pw", "~*", "&*", "+@all", "-client|tracking")
	for name, c := range map[string]struct {
		rdb   *redis.Client
		reply string
	}{
		"renamed": {renamed.Client(t), "unknown command"},
		"acl":     {acl.Client(t, func(o *redis.Options) { o.Username, o.Password = "notrack", "pw" }), "NOPERM"},
	} {
		var re *RefusedError
		err := Probe(ctx, c.rdb)
		if !errors.As(err, &re) || !strings.Contains(re.Reply, c.reply) || re.Addr != c.rdb.Options().Addr {
			t.Fatalf("%s: Probe = %v; want a *RefusedError from %s quoting %q", name, err, c.rdb.Options().Addr, c.reply)
		}
	}
	if err := Probe(ctx, server(t).Client(t)); err != nil {
		t.Fatalf("a server with tracking: %v", err)
	}
	gone := server(t)
	rdb := gone.Client(t)
	gone.Stop(t)
	if err := Probe(ctx, rdb); err != nil {
		t.Fatalf("a server that cannot be reached: %v", err)
	}
}

// TestReaderTracksKeys: with NewKeys, a key read through Reader is told
// when another client writes it, and a key written but never read is
// not; Redis tracks exactly the key read.
func TestReaderTracksKeys(t *testing.T) {
	t.Parallel()
	s := server(t)
	rdb := s.Client(t)
	other := s.Client(t)
	ctx := t.Context()
	r := &recorder{}
	tr, err := NewKeys(rdb, []string{"group:"}, 25*time.Millisecond, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	g := tr.Gate(time.Minute)
	waitFor(t, "the gate open", g.Open)
	other.Set(ctx, "read", "1", 0)
	rd := tr.Reader(ctx, "read", false)
	if rd == nil {
		t.Fatal("no tracked read with the listener subscribed")
	}
	get := rd.Pipeline().Get(ctx, "read")
	_, _ = rd.Pipeline().Exec(ctx)
	if tracked, again := rd.End(get); !tracked || again || get.Val() != "1" {
		t.Fatalf("tracked read: tracked %v, again %v, %q, %v", tracked, again, get.Val(), get.Err())
	}
	other.Set(ctx, "unread", "2", 0)
	other.Set(ctx, "read", "3", 0)
	waitFor(t, "the read key's invalidation", func() bool { return r.count("key:read") > 0 })
	if n := r.count("key:unread"); n != 0 {
		t.Fatalf("a key never read was invalidated %d times", n)
	}
	if m, k := tr.Received(); m != 1 || k != 1 {
		t.Fatalf("received %d messages naming %d keys; want the one", m, k)
	}
}
