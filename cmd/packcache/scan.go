package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// scanFlags are the flags of the commands that scan a prefix.
type scanFlags struct {
	count        int64 // --count, the COUNT hint of each SCAN
	progressFlag bool  // --progress
	progress     bool  // whether to draw progress (showProgress)
}

// register registers --count, with the given default, and --progress on
// cmd.
func (s *scanFlags) register(cmd *cobra.Command, count int64) {
	fs := cmd.Flags()
	fs.Int64Var(&s.count, "count", count, "COUNT hint of each SCAN")
	fs.BoolVar(&s.progressFlag, "progress", false, "draw progress on stderr even when it is not a terminal")
}

// matchPattern is the SCAN MATCH pattern for keys beginning with prefix,
// with the glob characters of the prefix escaped.
func matchPattern(prefix string) string {
	var b strings.Builder
	for i := 0; i < len(prefix); i++ {
		switch c := prefix[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('*')
	return b.String()
}

// position is where the scan of one master is: the next SCAN cursor, or
// done. A SCAN cursor means something only to the server process that
// returned it (it walks that process's hash table, salted with a seed of
// its own): server is the short run_id of that process, and a cursor is
// refused on any other, such as a replica promoted by a failover or the
// same address restarted, where it would skip keys silently.
type position struct {
	next   uint64
	done   bool
	server string
}

func (p position) String() string {
	if p.done {
		return "done"
	}
	if p.server == "" { // not begun: 0, valid anywhere
		return strconv.FormatUint(p.next, 10)
	}
	return strconv.FormatUint(p.next, 10) + "@" + p.server
}

// serverIDLen is how much of a run_id a cursor carries: enough to tell
// server processes apart.
const serverIDLen = 12

// cursors is where a scan of every master is, by master name. A single
// server (or a Sentinel's master) is the one name "". A master missing
// from the map starts from the beginning.
//
// As text, a single server's cursor is the number SCAN returned and the
// server's id, "1792@8f0c9be1a2d3", or "done"; a cluster's is
// "host:port=cursor" for every master, sorted and joined by commas, for
// example "127.0.0.1:7000=1792@8f0c9be1a2d3,127.0.0.1:7001=done,...".
type cursors map[string]position

func (cs cursors) String() string {
	if p, ok := cs[""]; ok && len(cs) == 1 {
		return p.String()
	}
	names := make([]string, 0, len(cs))
	for n := range cs {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + cs[n].String()
	}
	return strings.Join(parts, ",")
}

// parseCursors reads --cursor. masters are the cluster's masters, or nil
// for a single server. A cluster cursor must name only current masters:
// SCAN cursors mean nothing on another node, so after a failover the scan
// of the new master has to start again (which recompress may do safely).
func parseCursors(s string, masters []string) (cursors, error) {
	if masters == nil {
		p, err := parsePosition(s)
		if err != nil {
			return nil, usagef("--cursor %q: %v (a single server's cursor is N@ID as printed, or done)", s, err)
		}
		return cursors{"": p}, nil
	}
	cs := cursors{}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return nil, usagef("--cursor %q: a cluster cursor is host:port=cursor for each master, joined by commas", s)
		}
		if !slices.Contains(masters, name) {
			return nil, usagef("--cursor names %s, which is not a master of this cluster now (masters: %s); SCAN cursors are per node, so start that part again without it", name, strings.Join(masters, ", "))
		}
		p, err := parsePosition(val)
		if err != nil {
			return nil, usagef("--cursor %q: %s: %v", s, name, err)
		}
		cs[name] = p
	}
	return cs, nil
}

func parsePosition(s string) (position, error) {
	if s == "done" {
		return position{done: true}, nil
	}
	num, id, ok := strings.Cut(s, "@")
	n, err := strconv.ParseUint(num, 10, 64)
	if err == nil && !ok && n == 0 {
		return position{}, nil // the beginning, on any server
	}
	if err != nil || !ok || len(id) != serverIDLen {
		return position{}, fmt.Errorf("not a cursor as packcache prints it (N@ID: a SCAN cursor and the server's id)")
	}
	return position{next: n, server: id}, nil
}

// serverID returns the short run_id of the server process node reaches.
func serverID(ctx context.Context, node *redis.Client) (string, error) {
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok && len(strings.TrimSpace(v)) >= serverIDLen {
			return strings.TrimSpace(v)[:serverIDLen], nil
		}
	}
	return "", fmt.Errorf("no run_id in INFO server")
}

// errOtherServer reports a cursor taken on another server process.
type errOtherServer struct{ name, want, got string }

func (e errOtherServer) Error() string {
	where := e.name
	if where == "" {
		where = "the server"
	}
	return fmt.Sprintf("--cursor was taken on server %s, but %s is now server %s (restarted, or failed over to a replica): a SCAN cursor means nothing to another server and would skip keys; run again without --cursor for it (recompress leaves values already rewritten alone)", e.want, where, e.got)
}

// scanner walks the keys matching a pattern on every master, from saved
// cursors, and keeps the cursors up to date: a master's cursor moves past a
// page only once the page's function has returned without error.
type scanner struct {
	c     *conn
	match string
	count int64

	// moved, if set, is called each time a master's cursor has moved past
	// a page.
	moved func()

	mu  sync.Mutex
	pos cursors
}

func newScanner(c *conn, match string, count int64, from cursors) *scanner {
	pos := cursors{}
	for n, p := range from {
		pos[n] = p
	}
	return &scanner{c: c, match: match, count: count, pos: pos}
}

// cursors returns where the scan is now.
func (s *scanner) cursors() cursors {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make(cursors, len(s.pos))
	for n, p := range s.pos {
		cs[n] = p
	}
	return cs
}

// run scans every master, calling page for each non-empty page of keys.
// Masters are scanned concurrently on a cluster, so page must be safe for
// concurrent use.
func (s *scanner) run(ctx context.Context, page func(ctx context.Context, keys []string) error) error {
	return s.c.eachMaster(ctx, func(ctx context.Context, node *redis.Client, name string) error {
		s.mu.Lock()
		p := s.pos[name]
		if _, ok := s.pos[name]; !ok {
			s.pos[name] = p // every master appears in the printed cursor
		}
		s.mu.Unlock()
		if p.done {
			return nil
		}
		id, err := serverID(ctx, node)
		if err != nil {
			return scanErr(ctx, name, err)
		}
		if p.server != "" && p.server != id {
			return usageError{errOtherServer{name, p.server, id}}
		}
		p.server = id
		cur := p.next
		for {
			keys, next, err := node.Scan(ctx, cur, s.match, s.count).Result()
			if err != nil {
				return scanErr(ctx, name, err)
			}
			if len(keys) > 0 {
				if err := page(ctx, keys); err != nil {
					return err
				}
			}
			cur = next
			s.mu.Lock()
			s.pos[name] = position{next: next, done: next == 0, server: id}
			s.mu.Unlock()
			if s.moved != nil {
				s.moved()
			}
			if next == 0 {
				return nil
			}
		}
	})
}

func scanErr(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if name == "" {
		return fmt.Errorf("SCAN: %w", err)
	}
	return fmt.Errorf("SCAN on %s: %w", name, err)
}

// countKeys counts the keys matching the scanner's pattern from its
// cursors, without reading any value, and leaves the scanner where it was.
func (s *scanner) countKeys(ctx context.Context) (int64, error) {
	pre := newScanner(s.c, s.match, s.count, s.cursors())
	var mu sync.Mutex
	var n int64
	err := pre.run(ctx, func(_ context.Context, keys []string) error {
		mu.Lock()
		n += int64(len(keys))
		mu.Unlock()
		return nil
	})
	return n, err
}
