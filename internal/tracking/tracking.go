// Package tracking keeps a near cache fresh with Redis's CLIENT TRACKING:
// it holds one connection per Redis master (following a Cluster's
// topology and a Sentinel client's failovers) on which tracking is on in
// broadcast mode for the near-cached prefixes, and tells its Handler the
// name of every key under them that anything writes, expires or evicts;
// with NewKeys, also of every key read through one of its tracked reads
// (keys.go). Probe asks a server, before, whether it accepts tracking.
//
// What a caller can rely on:
//
//   - Every invalidation Redis sends reaches Handler.Invalidate, in the
//     order Redis sent it on that master's connection. A FLUSHALL or
//     FLUSHDB, a connection that drops, a connection that (re)subscribes
//     and a change of a Cluster's masters call Handler.Flush instead: what
//     was written meanwhile is unknown.
//   - A Gate says whether near caches that tolerate a given lag may
//     serve: only while every connection is subscribed and has proved,
//     by a heartbeat sent at most that lag ago whose reply came back,
//     that it applied every write Redis had completed when the heartbeat
//     was sent. Handler.Flush is called before a gate opens after a
//     (re)connection. Gate.Open costs an atomic load and a monotonic
//     clock read; the deadline is compared with the clock on every call,
//     so a machine too loaded to run the tracker's goroutines cannot keep
//     a gate open past its lag.
//   - Failures (a lost connection, a Redis that refuses CLIENT TRACKING,
//     a Cluster whose masters cannot be listed) go to Handler.Report as
//     values; a connection that never got going is reported once, however
//     often it is retried.
//   - Close stops every connection and goroutine and closes every gate.
//
// Start with New.
package tracking

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// A Handler is told what the invalidation stream says. Its methods are
// called from the Tracker's goroutines, one connection's calls in the
// order that connection received them, and must not block for long: the
// stream waits meanwhile.
type Handler interface {
	// Invalidate is told that keys were written, expired or evicted.
	Invalidate(keys []string)
	// Flush is told that any key may have been written.
	Flush()
	// Report is told of a failure of the stream.
	Report(err error)
}

// A Tracker keeps a near cache fresh: it holds one connection per
// Redis master on which CLIENT TRACKING is on in broadcast mode for the
// near-cached prefixes, redirected to the connection itself, which is
// subscribed to __redis__:invalidate (RESP2, so it works on every Redis
// from 6.0 whatever protocol the application's client speaks). Redis then
// sends it the name of every key under those prefixes that anything
// writes, expires or evicts.
//
// Heartbeats prove the stream current: every interval (a quarter of the
// lag the near caches tolerate), each connection sends a PING; Redis
// queues the reply after every invalidation it queued before, so once the
// reply is back every write Redis had completed when the PING was sent
// has been applied. A near cache serves only while its Gate is open, and
// is emptied (Handler.Flush) whenever a connection drops, before it serves
// again.
type Tracker struct {
	prefixes []string // BCAST prefixes; none: every key
	keys     bool     // reader connections track keys too (see keys.go)
	hooks    []redis.Hook

	// received counts the invalidation messages the listeners received,
	// and the keys they named (see Received).
	received, receivedKeys atomic.Uint64
	interval               time.Duration
	h                      Handler

	// base is the dedicated client's options (nil for a cluster, whose
	// masters' options are taken from its node clients).
	base    *redis.Options
	cluster *redis.ClusterClient
	// failover is the application's client when it reaches its master
	// through Sentinel: the listener checks, before each heartbeat, that
	// it is connected to the server that client writes to.
	failover *redis.Client

	// epoch is the origin of the heartbeats' times: monotonic, so that a
	// step of the wall clock cannot stretch or shrink MaxLag.
	epoch time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	listeners map[string]*listener // by address
	current   atomic.Pointer[[]*listener]

	// gates say, for each MaxLag of the cache's near caches, until when
	// they may serve, so that a near hit costs an atomic load and a
	// monotonic clock read rather than a look at every listener. recheck
	// sets them whenever a proof arrives or a connection changes.
	gmu   sync.Mutex
	gates []*Gate
}

// A Gate is until when the near caches of one MaxLag may serve: while
// every invalidation connection is subscribed and has proved, within
// MaxLag, that it applied every write Redis had completed by then.
//
// The deadline is compared with the clock on every read, not closed by a
// timer: a timer fires late on a loaded machine, and a gate it had not
// closed yet would serve past MaxLag.
type Gate struct {
	tr     *Tracker
	maxLag time.Duration
	epoch  time.Time    // the tracker's epoch
	until  atomic.Int64 // nanoseconds since epoch; 0: closed
}

// Open reports whether the near caches of g may serve now.
func (g *Gate) Open() bool {
	_, open := g.OpenNow()
	return open
}

// OpenNow reports whether the near caches of g may serve now, and the
// time it read: nanoseconds since the gate's epoch, on the monotonic
// clock, so that a near hit can check its entry's end against the same
// reading.
func (g *Gate) OpenNow() (now int64, open bool) {
	now = int64(time.Since(g.epoch))
	until := g.until.Load()
	return now, until != 0 && now < until
}

// Untracked returns a gate that is always open and admits every key, for
// a near cache bounded by time alone: no tracker keeps it, and nothing
// invalidates it.
func Untracked() *Gate {
	g := &Gate{epoch: time.Now()}
	g.until.Store(1<<63 - 1)
	return g
}

// Epoch is the time the gate's readings count from.
func (g *Gate) Epoch() time.Time { return g.epoch }

// Gate returns the gate of near caches that tolerate maxLag, the same one
// for every call with the same maxLag.
func (tr *Tracker) Gate(maxLag time.Duration) *Gate {
	tr.gmu.Lock()
	var g *Gate
	for _, o := range tr.gates {
		if o.maxLag == maxLag {
			g = o
		}
	}
	if g == nil {
		g = &Gate{tr: tr, maxLag: maxLag, epoch: tr.epoch}
		tr.gates = append(tr.gates, g)
	}
	tr.gmu.Unlock()
	tr.recheck()
	return g
}

// HoldGates keeps every update of tr's gates waiting until release is
// called. It is for tests: it stands for a machine too loaded to run, in
// time, whatever would close them, so that only the clock can.
func (tr *Tracker) HoldGates() (release func()) {
	tr.gmu.Lock()
	return tr.gmu.Unlock
}

// recheck sets each gate's deadline from the listeners' proofs: the
// oldest of their latest proofs plus the gate's MaxLag, or closed while a
// listener has none.
func (tr *Tracker) recheck() {
	tr.gmu.Lock()
	defer tr.gmu.Unlock()
	ls := *tr.current.Load()
	proven := len(ls) > 0
	oldest := int64(1<<63 - 1) // the oldest of the latest proofs
	for _, l := range ls {
		c := l.confirmed.Load()
		if !l.subscribed.Load() || c == 0 {
			proven = false
			break
		}
		oldest = min(oldest, c)
	}
	for _, g := range tr.gates {
		var until int64
		if proven && tr.ctx.Err() == nil {
			until = oldest + int64(g.maxLag)
		}
		g.until.Store(until)
	}
}

// A listener is the invalidation connection of one Redis master.
type listener struct {
	addr   string
	client *redis.Client
	ps     *redis.PubSub
	stop   context.CancelFunc

	// subscribed is set once the connection is subscribed with tracking
	// on, after the near cache was emptied of what it might have missed;
	// confirmed is when the latest heartbeat whose reply came back since
	// was sent, in nanoseconds since the tracker's epoch (0: none since
	// it subscribed).
	subscribed atomic.Bool
	confirmed  atomic.Int64
	failed     atomic.Bool // a failure was reported before it ever subscribed

	// runID is the run_id of the server the connection reached, read when
	// it connects, for the failover check.
	runID atomic.Pointer[string]

	// With tracking per key (keys.go): opt dials the readers, id is the
	// connection's CLIENT ID, which they redirect to, and readers are
	// those of the connection now subscribed.
	opt     redis.Options
	id      atomic.Int64
	readers atomic.Pointer[readers]
}

const invalidationChannel = "__redis__:invalidate"

// New starts the invalidation connections for rdb, which must be a
// *redis.Client (a single node, or a Sentinel client from
// redis.NewFailoverClient) or a *redis.ClusterClient: it tracks the keys
// under prefixes (an empty prefix: every key), tells h what the stream
// says, and sends a heartbeat through each connection every interval.
// The connections are dialled with the options of rdb (or of its node
// clients), and named packcache-invalidation.
//
// The gates stay closed until the connections have subscribed and a
// heartbeat has come back; New does not wait for that.
func New(rdb redis.UniversalClient, prefixes []string, interval time.Duration, h Handler) (*Tracker, error) {
	return newTracker(rdb, prefixes, interval, h, false, nil)
}

// NewKeys is New, and the tracker also tracks per key: see Reader. The
// reader connections' clients are given hooks.
func NewKeys(rdb redis.UniversalClient, prefixes []string, interval time.Duration, h Handler, hooks ...redis.Hook) (*Tracker, error) {
	return newTracker(rdb, prefixes, interval, h, true, hooks)
}

func newTracker(rdb redis.UniversalClient, prefixes []string, interval time.Duration, h Handler, keys bool, hooks []redis.Hook) (*Tracker, error) {
	tr := &Tracker{
		keys:     keys,
		hooks:    hooks,
		prefixes: coverPrefixes(prefixes),
		interval: interval,
		h:        h,
	}
	tr.epoch = time.Now()
	switch c := rdb.(type) {
	case *redis.Client:
		tr.base = c.Options()
		if tr.base.Addr == "FailoverClient" { // go-redis's name for a Sentinel client's
			tr.failover = c
		}
	case *redis.ClusterClient:
		tr.cluster = c
	default:
		return nil, fmt.Errorf("WithLocalCache: a %T is not supported: it needs a *redis.Client (single node or Sentinel) or a *redis.ClusterClient", rdb)
	}
	tr.ctx, tr.cancel = context.WithCancel(context.Background())
	tr.listeners = map[string]*listener{}
	empty := []*listener{}
	tr.current.Store(&empty)
	if tr.cluster == nil {
		tr.add("", tr.base)
	} else {
		tr.follow()
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-tr.ctx.Done():
					return
				case <-t.C:
					tr.follow()
				}
			}
		}()
	}
	return tr, nil
}

// coverPrefixes drops the prefixes another covers: Redis refuses
// overlapping broadcast prefixes. An empty prefix covers every key.
func coverPrefixes(ps []string) []string {
	ps = slices.Clone(ps)
	slices.Sort(ps)
	var out []string
	for _, p := range ps {
		if p == "" {
			return nil
		}
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// follow makes the listeners match the cluster's masters: it starts one
// for a new master and stops the one of a master that is gone. A change
// empties the near cache: keys may have moved to a master whose stream
// was not followed.
func (tr *Tracker) follow() {
	ctx, cancel := context.WithTimeout(tr.ctx, 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	masters := map[string]*redis.Options{}
	err := tr.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		masters[c.Options().Addr] = c.Options()
		mu.Unlock()
		return nil
	})
	if err != nil {
		if tr.ctx.Err() == nil {
			tr.h.Report(fmt.Errorf("packcache: near cache: finding the cluster's masters: %w", err))
		}
		if len(masters) == 0 {
			return
		}
	}
	tr.mu.Lock()
	changed := false
	for addr, l := range tr.listeners {
		if _, ok := masters[addr]; !ok {
			l.close()
			delete(tr.listeners, addr)
			changed = true
		}
	}
	tr.mu.Unlock()
	for addr, opt := range masters {
		tr.mu.Lock()
		_, ok := tr.listeners[addr]
		tr.mu.Unlock()
		if !ok {
			tr.add(addr, opt)
			changed = true
		}
	}
	if changed {
		tr.publish()
		tr.h.Flush()
	}
}

// add starts the listener of the master at addr, dialled with opt.
func (tr *Tracker) add(addr string, opt *redis.Options) {
	o := *opt
	userConnect := o.OnConnect
	var lp atomic.Pointer[listener] // the listener, for OnConnect
	o.Protocol = 2                  // invalidations as Pub/Sub messages: see Tracker
	o.ClientName = "packcache-invalidation"
	o.ContextTimeoutEnabled = true
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 1
	Own(&o)
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userConnect != nil {
			if err := userConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		lp.Load().id.Store(id)
		args := []any{"CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST"}
		for _, p := range tr.prefixes {
			args = append(args, "PREFIX", p)
		}
		if err := cn.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("CLIENT TRACKING (near caches need Redis 6.0 or later): %w", err)
		}
		if tr.failover != nil {
			id, err := runID(ctx, cn)
			if err != nil {
				return err
			}
			lp.Load().runID.Store(&id)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(tr.ctx)
	l := &listener{addr: addr, client: redis.NewClient(&o), stop: cancel, opt: *opt}
	lp.Store(l)
	l.ps = l.client.Subscribe(ctx, invalidationChannel)
	tr.mu.Lock()
	tr.listeners[addr] = l
	tr.mu.Unlock()
	tr.publish()
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		tr.listen(ctx, l)
	}()
}

// publish makes the current listeners the ones serving checks.
func (tr *Tracker) publish() {
	tr.mu.Lock()
	ls := make([]*listener, 0, len(tr.listeners))
	for _, l := range tr.listeners {
		ls = append(ls, l)
	}
	tr.mu.Unlock()
	tr.current.Store(&ls)
	tr.recheck()
}

func (l *listener) close() {
	l.stop()
	l.subscribed.Store(false)
}

// receiveSlice is the longest a listener waits for a message before it
// looks at its context again: how long Close may wait for it.
const receiveSlice = 100 * time.Millisecond

// listen applies l's invalidations and heartbeats until ctx ends.
func (tr *Tracker) listen(ctx context.Context, l *listener) {
	defer l.client.Close()
	defer func() { l.ps.Close() }() // l.ps may be replaced after a failover
	defer func() {
		if rs := l.readers.Swap(nil); rs != nil {
			rs.close()
		}
	}()
	var lastPing time.Time
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		if time.Since(lastPing) >= tr.interval {
			lastPing = time.Now()
			if tr.failover != nil && !tr.sameServer(ctx, l, &backoff) {
				continue // no heartbeat: the proof lapses
			}
			// The proof counts from when the heartbeat was sent, or, with
			// tracking per key, from when the readers were proved alive.
			proof := int64(time.Since(tr.epoch))
			if tr.keys {
				proof = tr.pingReaders(ctx, l)
			}
			if err := l.ps.Ping(ctx, strconv.FormatInt(proof, 10)); err != nil {
				tr.down(ctx, l, err, &backoff)
				continue
			}
		}
		// go-redis bounds a receive by its timeout only, not by ctx: wait
		// in slices short enough that Close does not wait for a heartbeat
		// interval (MaxLag/4, which may be seconds).
		msg, err := l.ps.ReceiveTimeout(ctx, min(tr.interval, receiveSlice))
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				// Nothing arrived within the interval: time to ping.
			case strings.Contains(err.Error(), "unsupported pubsub message payload: <nil>"):
				// An invalidation without keys: FLUSHALL or FLUSHDB.
				tr.h.Flush()
			default:
				tr.down(ctx, l, err, &backoff)
			}
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel != invalidationChannel {
				continue
			}
			if len(m.PayloadSlice) == 0 && m.Payload == "" {
				tr.h.Flush()
				continue
			}
			keys := m.PayloadSlice
			if len(keys) == 0 {
				keys = []string{m.Payload}
			}
			tr.received.Add(1)
			tr.receivedKeys.Add(uint64(len(keys)))
			tr.h.Invalidate(keys)
		case *redis.Pong:
			if !l.subscribed.Load() {
				continue
			}
			if sent, err := strconv.ParseInt(m.Payload, 10, 64); err == nil && sent > l.confirmed.Load() {
				l.confirmed.Store(sent)
				tr.recheck()
			}
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == invalidationChannel {
				// (Re)subscribed with tracking on: whatever was written
				// while the stream was down is unknown, so empty the near
				// cache; serving resumes with the reply to a heartbeat sent
				// from now on.
				l.confirmed.Store(0)
				tr.recheck()
				if tr.keys {
					// Readers that redirect to this connection, before
					// the near cache is emptied of what the old ones read.
					var run string
					if p := l.runID.Load(); p != nil {
						run = *p
					}
					if old := l.readers.Swap(tr.newReaders(l.opt, l.id.Load(), run)); old != nil {
						old.close()
					}
				}
				tr.h.Flush()
				l.subscribed.Store(true)
				lastPing = time.Time{}
			}
		}
	}
}

// sameServer reports whether l is connected to the server the Sentinel
// client writes to now. After a failover it is not: l is then treated as
// down, and connected again, through Sentinel, to the new master.
func (tr *Tracker) sameServer(ctx context.Context, l *listener, backoff *time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, tr.interval)
	defer cancel()
	want, err := runID(cctx, tr.failover)
	if err != nil {
		return false // unknown: send no heartbeat, so the proof lapses
	}
	if got := l.runID.Load(); got != nil && *got == want {
		return true
	}
	if got := l.runID.Load(); got == nil {
		return false // not connected yet
	}
	tr.down(ctx, l, fmt.Errorf("the master is now the server %s", want), backoff)
	l.ps.Close()
	l.ps = l.client.Subscribe(ctx, invalidationChannel)
	return false
}

// runID returns the run_id of the server c reaches.
func runID(ctx context.Context, c interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("no run_id in INFO server")
}

// down handles a failure of l's connection: the near cache stops serving
// and is emptied; the next receive reconnects (go-redis redials a Pub/Sub
// connection and subscribes it again), after a backoff.
func (tr *Tracker) down(ctx context.Context, l *listener, err error, backoff *time.Duration) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case l.subscribed.Swap(false):
		tr.recheck()
		tr.h.Flush()
		tr.h.Report(fmt.Errorf("packcache: near cache: invalidation connection to %s lost, near cache emptied: %w", l.addrOr(), err))
	case !l.failed.Swap(true):
		// It never got going (Redis older than 6.0, or without CLIENT
		// TRACKING, or an ACL that forbids it): say so once.
		tr.h.Report(fmt.Errorf("packcache: near cache: no invalidation connection to %s, so the near cache does not serve: %w", l.addrOr(), err))
	}
	t := time.NewTimer(*backoff)
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	*backoff = min(2**backoff, time.Second)
}

func (l *listener) addrOr() string {
	if l.addr == "" {
		return "redis"
	}
	return l.addr
}

func (l *listener) proven(oldest int64) bool {
	c := l.confirmed.Load()
	return l.subscribed.Load() && c != 0 && c >= oldest
}

// Admits reports whether a value of key read now may enter the near
// caches of g: g is open (every invalidation connection subscribed and
// proved within g's MaxLag), and, on a Cluster, the master the client
// maps key to has a proven connection: a value read from a master the
// tracker does not follow yet (a new one) must not enter a near cache.
func (g *Gate) Admits(key string) bool {
	if !g.Open() {
		return false
	}
	tr := g.tr
	if tr == nil || tr.cluster == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(tr.ctx, 50*time.Millisecond)
	defer cancel()
	m, err := tr.cluster.MasterForKey(ctx, key)
	if err != nil {
		return false
	}
	addr := m.Options().Addr
	oldest := int64(time.Since(tr.epoch) - g.maxLag)
	for _, l := range *tr.current.Load() {
		if l.addr == addr {
			return l.proven(oldest)
		}
	}
	return false
}

// Received returns how many invalidation messages naming keys the
// listeners have received, and how many keys they named: what the stream
// costs this process.
func (tr *Tracker) Received() (messages, keys uint64) {
	return tr.received.Load(), tr.receivedKeys.Load()
}

// Close stops every connection and waits for the tracker's goroutines;
// every gate is closed when it returns, and h is called no more.
func (tr *Tracker) Close() {
	tr.cancel()
	tr.mu.Lock()
	for _, l := range tr.listeners {
		l.close()
	}
	tr.mu.Unlock()
	tr.wg.Wait()
	tr.gmu.Lock()
	for _, g := range tr.gates {
		g.until.Store(0)
	}
	tr.gmu.Unlock()
}

// Own readies o, a copy of a user's client options, for a client of the
// cache's own: no maintenance notifications (a RESP3 feature; disabled,
// they start no goroutine) and no client-side cache of go-redis's, which
// would answer the cache's reads from a copy of its own and warn, at
// init, on a RESP2 connection.
func Own(o *redis.Options) {
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.ClientSideCacheConfig, o.ClientSideCache = nil, nil
	o.ClientSideCacheRefreshOnInvalidate, o.ClientSideCacheCoalesceMisses = false, false
}
