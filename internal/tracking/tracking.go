package packcache

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

// An invalidator keeps a near cache fresh: it holds one connection per
// Redis master on which CLIENT TRACKING is on in broadcast mode for the
// near-cached prefixes, redirected to the connection itself, which is
// subscribed to __redis__:invalidate (RESP2, so it works on every Redis
// from 6.0 whatever protocol the application's client speaks). Redis then
// sends it the name of every key under those prefixes that anything
// writes, expires or evicts.
//
// Heartbeats prove the stream current: every quarter of the lag it
// tolerates, each connection sends a PING; Redis queues the reply after
// every invalidation it queued before, so once the reply is back every
// write Redis had completed when the PING was sent has been applied. The
// near cache serves only while each connection's latest proof is younger
// than its MaxLag, and is emptied whenever a connection drops, before it
// serves again.
type invalidator struct {
	prefixes []string // BCAST prefixes; none: every key
	interval time.Duration
	invalid  func(keys []string) // remove these keys' entries
	flush    func()              // remove every entry
	report   func(err error)

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
	gates []*gate
}

// A gate is until when the near caches of one MaxLag may serve: while
// every invalidation connection is subscribed and has proved, within
// MaxLag, that it applied every write Redis had completed by then.
//
// The deadline is compared with the clock on every read, not closed by a
// timer: a timer fires late on a loaded machine, and a gate it had not
// closed yet would serve past MaxLag.
type gate struct {
	maxLag time.Duration
	epoch  time.Time    // the invalidator's epoch
	until  atomic.Int64 // nanoseconds since epoch; 0: closed
}

// open reports whether the near caches of g may serve now.
func (g *gate) open() bool {
	until := g.until.Load()
	return until != 0 && int64(time.Since(g.epoch)) < until
}

// gate returns the gate of near caches with maxLag.
func (inv *invalidator) gate(maxLag time.Duration) *gate {
	inv.gmu.Lock()
	var g *gate
	for _, o := range inv.gates {
		if o.maxLag == maxLag {
			g = o
		}
	}
	if g == nil {
		g = &gate{maxLag: maxLag, epoch: inv.epoch}
		inv.gates = append(inv.gates, g)
	}
	inv.gmu.Unlock()
	inv.recheck()
	return g
}

// recheck sets each gate's deadline from the listeners' proofs: the
// oldest of their latest proofs plus the gate's MaxLag, or closed while a
// listener has none.
func (inv *invalidator) recheck() {
	inv.gmu.Lock()
	defer inv.gmu.Unlock()
	ls := *inv.current.Load()
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
	for _, g := range inv.gates {
		var until int64
		if proven && inv.ctx.Err() == nil {
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
	// was sent, in nanoseconds since the invalidator's epoch (0: none since
	// it subscribed).
	subscribed atomic.Bool
	confirmed  atomic.Int64
	failed     atomic.Bool // a failure was reported before it ever subscribed

	// runID is the run_id of the server the connection reached, read when
	// it connects, for the failover check.
	runID atomic.Pointer[string]
}

const invalidationChannel = "__redis__:invalidate"

// newInvalidator starts the invalidation connections for rdb. interval is
// how often each connection sends a heartbeat.
func newInvalidator(rdb redis.UniversalClient, prefixes []string, interval time.Duration, invalid func([]string), flush func(), report func(error)) (*invalidator, error) {
	inv := &invalidator{
		prefixes: coverPrefixes(prefixes),
		interval: interval,
		invalid:  invalid,
		flush:    flush,
		report:   report,
	}
	inv.epoch = time.Now()
	switch c := rdb.(type) {
	case *redis.Client:
		inv.base = c.Options()
		if inv.base.Addr == "FailoverClient" { // go-redis's name for a Sentinel client's
			inv.failover = c
		}
	case *redis.ClusterClient:
		inv.cluster = c
	default:
		return nil, fmt.Errorf("WithLocalCache: a %T is not supported: it needs a *redis.Client (single node or Sentinel) or a *redis.ClusterClient", rdb)
	}
	inv.ctx, inv.cancel = context.WithCancel(context.Background())
	inv.listeners = map[string]*listener{}
	empty := []*listener{}
	inv.current.Store(&empty)
	if inv.cluster == nil {
		inv.add("", inv.base)
	} else {
		inv.follow()
		inv.wg.Add(1)
		go func() {
			defer inv.wg.Done()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-inv.ctx.Done():
					return
				case <-t.C:
					inv.follow()
				}
			}
		}()
	}
	return inv, nil
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
func (inv *invalidator) follow() {
	ctx, cancel := context.WithTimeout(inv.ctx, 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	masters := map[string]*redis.Options{}
	err := inv.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		masters[c.Options().Addr] = c.Options()
		mu.Unlock()
		return nil
	})
	if err != nil {
		if inv.ctx.Err() == nil {
			inv.report(fmt.Errorf("packcache: near cache: finding the cluster's masters: %w", err))
		}
		if len(masters) == 0 {
			return
		}
	}
	inv.mu.Lock()
	changed := false
	for addr, l := range inv.listeners {
		if _, ok := masters[addr]; !ok {
			l.close()
			delete(inv.listeners, addr)
			changed = true
		}
	}
	inv.mu.Unlock()
	for addr, opt := range masters {
		inv.mu.Lock()
		_, ok := inv.listeners[addr]
		inv.mu.Unlock()
		if !ok {
			inv.add(addr, opt)
			changed = true
		}
	}
	if changed {
		inv.publish()
		inv.flush()
	}
}

// add starts the listener of the master at addr, dialled with opt.
func (inv *invalidator) add(addr string, opt *redis.Options) {
	o := *opt
	userConnect := o.OnConnect
	var lp atomic.Pointer[listener] // the listener, for OnConnect
	o.Protocol = 2                  // invalidations as Pub/Sub messages: see invalidator
	o.ClientName = "packcache-invalidation"
	o.ContextTimeoutEnabled = true
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 1
	// Maintenance notifications are a RESP3 feature, which this
	// connection does not speak; disabled, they start no goroutine.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
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
		args := []any{"CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST"}
		for _, p := range inv.prefixes {
			args = append(args, "PREFIX", p)
		}
		if err := cn.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("CLIENT TRACKING (near caches need Redis 6.0 or later): %w", err)
		}
		if inv.failover != nil {
			id, err := runID(ctx, cn)
			if err != nil {
				return err
			}
			lp.Load().runID.Store(&id)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(inv.ctx)
	l := &listener{addr: addr, client: redis.NewClient(&o), stop: cancel}
	lp.Store(l)
	l.ps = l.client.Subscribe(ctx, invalidationChannel)
	inv.mu.Lock()
	inv.listeners[addr] = l
	inv.mu.Unlock()
	inv.publish()
	inv.wg.Add(1)
	go func() {
		defer inv.wg.Done()
		inv.listen(ctx, l)
	}()
}

// publish makes the current listeners the ones serving checks.
func (inv *invalidator) publish() {
	inv.mu.Lock()
	ls := make([]*listener, 0, len(inv.listeners))
	for _, l := range inv.listeners {
		ls = append(ls, l)
	}
	inv.mu.Unlock()
	inv.current.Store(&ls)
	inv.recheck()
}

func (l *listener) close() {
	l.stop()
	l.subscribed.Store(false)
}

// receiveSlice is the longest a listener waits for a message before it
// looks at its context again: how long Close may wait for it.
const receiveSlice = 100 * time.Millisecond

// listen applies l's invalidations and heartbeats until ctx ends.
func (inv *invalidator) listen(ctx context.Context, l *listener) {
	defer l.client.Close()
	defer func() { l.ps.Close() }() // l.ps may be replaced after a failover
	var lastPing time.Time
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		if time.Since(lastPing) >= inv.interval {
			lastPing = time.Now()
			if inv.failover != nil && !inv.sameServer(ctx, l, &backoff) {
				continue // no heartbeat: the proof lapses
			}
			if err := l.ps.Ping(ctx, strconv.FormatInt(int64(time.Since(inv.epoch)), 10)); err != nil {
				inv.down(ctx, l, err, &backoff)
				continue
			}
		}
		// go-redis bounds a receive by its timeout only, not by ctx: wait
		// in slices short enough that Close does not wait for a heartbeat
		// interval (MaxLag/4, which may be seconds).
		msg, err := l.ps.ReceiveTimeout(ctx, min(inv.interval, receiveSlice))
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				// Nothing arrived within the interval: time to ping.
			case strings.Contains(err.Error(), "unsupported pubsub message payload: <nil>"):
				// An invalidation without keys: FLUSHALL or FLUSHDB.
				inv.flush()
			default:
				inv.down(ctx, l, err, &backoff)
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
				inv.flush()
				continue
			}
			keys := m.PayloadSlice
			if len(keys) == 0 {
				keys = []string{m.Payload}
			}
			inv.invalid(keys)
		case *redis.Pong:
			if !l.subscribed.Load() {
				continue
			}
			if sent, err := strconv.ParseInt(m.Payload, 10, 64); err == nil && sent > l.confirmed.Load() {
				l.confirmed.Store(sent)
				inv.recheck()
			}
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == invalidationChannel {
				// (Re)subscribed with tracking on: whatever was written
				// while the stream was down is unknown, so empty the near
				// cache; serving resumes with the reply to a heartbeat sent
				// from now on.
				l.confirmed.Store(0)
				inv.recheck()
				inv.flush()
				l.subscribed.Store(true)
				lastPing = time.Time{}
			}
		}
	}
}

// sameServer reports whether l is connected to the server the Sentinel
// client writes to now. After a failover it is not: l is then treated as
// down, and connected again, through Sentinel, to the new master.
func (inv *invalidator) sameServer(ctx context.Context, l *listener, backoff *time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, inv.interval)
	defer cancel()
	want, err := runID(cctx, inv.failover)
	if err != nil {
		return false // unknown: send no heartbeat, so the proof lapses
	}
	if got := l.runID.Load(); got != nil && *got == want {
		return true
	}
	if got := l.runID.Load(); got == nil {
		return false // not connected yet
	}
	inv.down(ctx, l, fmt.Errorf("the master is now the server %s", want), backoff)
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
func (inv *invalidator) down(ctx context.Context, l *listener, err error, backoff *time.Duration) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case l.subscribed.Swap(false):
		inv.recheck()
		inv.flush()
		inv.report(fmt.Errorf("packcache: near cache: invalidation connection to %s lost, near cache emptied: %w", l.addrOr(), err))
	case !l.failed.Swap(true):
		// It never got going (Redis older than 6.0, or without CLIENT
		// TRACKING, or an ACL that forbids it): say so once.
		inv.report(fmt.Errorf("packcache: near cache: no invalidation connection to %s, so the near cache does not serve: %w", l.addrOr(), err))
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

// servingKey reports whether g is open (every invalidation connection
// subscribed and proved within g's MaxLag), and, on a Cluster, that the
// master the client maps key to has a proven listener: a value read from a
// master the invalidator does not follow yet (a new one) must not enter
// the near cache.
func (inv *invalidator) servingKey(key string, g *gate) bool {
	if !g.open() {
		return false
	}
	if inv.cluster == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(inv.ctx, 50*time.Millisecond)
	defer cancel()
	m, err := inv.cluster.MasterForKey(ctx, key)
	if err != nil {
		return false
	}
	addr := m.Options().Addr
	oldest := int64(time.Since(inv.epoch) - g.maxLag)
	for _, l := range *inv.current.Load() {
		if l.addr == addr {
			return l.proven(oldest)
		}
	}
	return false
}

// close stops every listener and waits for their goroutines.
func (inv *invalidator) close() {
	inv.cancel()
	inv.mu.Lock()
	for _, l := range inv.listeners {
		l.close()
	}
	inv.mu.Unlock()
	inv.wg.Wait()
	inv.gmu.Lock()
	for _, g := range inv.gates {
		g.until.Store(0)
	}
	inv.gmu.Unlock()
}
