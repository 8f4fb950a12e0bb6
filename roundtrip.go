package packcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every Redis call the cache makes goes through roundTrip (one key) or
// roundTripMany (a pipeline of keys, one round trip per node). They own,
// in one place, the rules of a call:
//
//   - the budget: the call's context ends WithRedisTimeout after it
//     begins, unless the caller's own deadline comes first;
//   - the breaker of the key's node: a node whose breaker is open is not
//     tried, and the call fails with ErrCircuitOpen;
//   - the NOSCRIPT retry of a pipelined script;
//   - the judgement of a failure: the caller's context ending is the
//     caller's own, never Redis's (it is returned as it is, not counted and
//     not told to the breaker); a refused connection opens the node's
//     breaker at once; anything else the node did wrong is one failure;
//   - the error: an *Error matching ErrRedis that names the key and the
//     cause (the refused dial, not only the budget running out);
//   - the counters and the observer.

// A budget is the context of one Redis call. go-redis bounds its network
// reads and writes by Deadline; Done ends its waits (for a pooled
// connection, between retries). A caller whose context cannot end, as the
// detached read a Get shares, gets a budget whose Done is a channel shared
// with every budget that ends within the same tick of the cache's clock,
// closed by one timer per tick: so a Get arms no timer and allocates one
// small struct, and its waits end at most a tick (a sixteenth of the
// budget) after its deadline. Other callers get context.WithDeadline.
type budget struct {
	context.Context // the caller's, for its values (and Done, Err when it can end)

	start    time.Time // when the call got its turn at the node
	deadline time.Time
	tick     *tick              // the shared Done, when the caller's context cannot end
	cancel   context.CancelFunc // the WithDeadline context's, otherwise
	nodes    *nodes             // the breakers, for the dial hook
	dialed   atomic.Pointer[dialFailure]
}

type budgetKey struct{}

// A dialFailure is a connection to addr that could not be made: the cause
// of its failure, which go-redis does not return when the budget runs out
// while it retries, and when it failed.
type dialFailure struct {
	addr string
	err  error
	at   int64 // unix nanoseconds
}

func (b *budget) Deadline() (time.Time, bool) { return b.deadline, true }

func (b *budget) Done() <-chan struct{} {
	if b.tick != nil {
		return b.tick.ch
	}
	return b.Context.Done()
}

func (b *budget) Err() error {
	if b.tick == nil {
		return b.Context.Err()
	}
	select {
	case <-b.tick.ch:
		if b.tick.aborted {
			// The node refused a connection: see ticks.abort.
			return context.Canceled
		}
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (b *budget) Value(key any) any {
	if key == (budgetKey{}) {
		return b
	}
	return b.Context.Value(key)
}

func (b *budget) end() {
	if b.cancel != nil {
		b.cancel()
	}
}

// A tick is the shared end of the budgets whose deadlines fall before its
// own end.
type tick struct {
	end     int64 // unix nanoseconds
	ch      chan struct{}
	closed  atomic.Bool
	aborted bool                 // written before ch is closed, read after
	prev    atomic.Pointer[tick] // the tick before it, while that one is open
}

// close ends the tick's budgets: at its end, or early (aborted) when the
// node refused a connection. It reports whether it closed the tick.
func (t *tick) close(aborted bool) bool {
	if !t.closed.CompareAndSwap(false, true) {
		return false
	}
	t.aborted = aborted
	close(t.ch)
	t.prev.Store(nil) // every tick before it has ended too
	return true
}

// ticks hands out the shared ends of budgets, one set per node. As every
// budget is as long as every other, their deadlines come in the order they
// began, and one tick serves all the budgets begun within a sixteenth of
// the budget.
type ticks struct {
	cur  atomic.Pointer[tick]
	step int64 // nanoseconds
}

// by returns a tick that ends at or after deadline, and at most a step
// after it.
func (k *ticks) by(deadline int64) *tick {
	for {
		t := k.cur.Load()
		if t != nil && t.end >= deadline && t.end-deadline <= k.step {
			return t
		}
		nt := &tick{end: deadline + k.step, ch: make(chan struct{})}
		if t != nil && t.end > nt.end {
			// A longer budget than those before it (not made by this
			// cache): a tick of its own, not shared.
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { nt.close(false) })
			return nt
		}
		if t != nil && !t.closed.Load() {
			nt.prev.Store(t)
		}
		if k.cur.CompareAndSwap(t, nt) {
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { nt.close(false) })
			return nt
		}
	}
}

// abort ends at once every budget of the node still running: the node
// refused a connection, and the calls under way would only wait out their
// budgets in go-redis's retries of the dial. Their error names the
// refusal (see judgeCall).
func (k *ticks) abort() {
	for t := k.cur.Swap(nil); t != nil; t = t.prev.Load() {
		t.close(true)
	}
}

// budget returns the context of one Redis call made for ctx to node (nil:
// a pipeline over several): ctx bounded by the cache's Redis time budget
// from now, unless ctx's own deadline comes first. The caller calls end
// when the call is done.
func (c *Cache[T]) budget(ctx context.Context, node *breaker) *budget {
	now := time.Now()
	b := &budget{Context: ctx, nodes: c.nodes, start: now}
	b.deadline = now.Add(c.redisTimeout)
	if ctx.Done() == nil {
		if node == nil {
			node = &c.nodes.one
		}
		b.tick = node.ticks.by(b.deadline.UnixNano())
		return b
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(b.deadline) {
		b.deadline = dl
		return b
	}
	b.Context, b.cancel = context.WithDeadline(ctx, b.deadline)
	return b
}

// refused reports whether a dial failed because nothing can be reached at
// the address: a refused or reset connection, an unreachable network or
// host, or a name that does not resolve.
func refused(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) && dns.IsNotFound
}

// roundTrip makes one Redis call, f, for key under ctx: op names it in
// errors ("get", "set", "delete", "lease"). f gets the budgeted context.
// The error is nil, redis.Nil, an *Error holding ctx's own error when ctx
// ended first (the call is then no failure of Redis's, and is not
// counted), or an *Error matching ErrRedis (and ErrCircuitOpen when key's
// node's breaker is open and it was not tried).
//
// The call first waits, under ctx alone, for one of the node's slots (see
// breaker.enter); its budget begins once it has one. A repeatable call (a
// read, or a write whose second copy changes nothing: SET, DEL; never a
// script whose reply tells what it did) that ran out of its budget while
// the node answered other calls (judged late: see judgeCall) is made
// again, each time with a budget of its own, for up to the load timeout
// or until ctx ends.
func (c *Cache[T]) roundTrip(ctx context.Context, op, key string, p *policy[T], repeatable bool, f func(context.Context) error) error {
	b := c.node(ctx, key)
	if err := b.enter(ctx, c.life.ctx.Done()); err != nil {
		return keyErr(op, key, err)
	}
	defer b.leave()
	var first time.Time
	for {
		if op != opInvalidate && !b.allow() {
			return circuitOpen(op, key, b)
		}
		bud := c.budget(ctx, b)
		if first.IsZero() {
			first = bud.start
		}
		o, err := c.judgeCall(ctx, bud, b, op, key, f(bud))
		bud.end()
		b.feed(o)
		if o == late && repeatable && c.life.ctx.Err() == nil && time.Since(first) < c.loadTimeout {
			// Redis is fine and the call can be made again: failing it
			// would send a read's surge, which this process cannot keep
			// up with, to the database, and make a write pending. The
			// caller waits under its own context.
			continue
		}
		if (o == failed || o == refusedConn) && err != nil && err != redis.Nil {
			c.redisFailed(p, b, err)
		}
		return err
	}
}

// node returns the breaker of key's node: on a Cluster, finding it may
// need the slot map, which is loaded under a budget of its own.
func (c *Cache[T]) node(ctx context.Context, key string) *breaker {
	if c.nodes.cluster == nil {
		return &c.nodes.one
	}
	bud := c.budget(ctx, &c.nodes.one)
	defer bud.end()
	return c.nodes.forKey(bud, key)
}

// roundTripMany makes one pipeline of Redis calls, one round trip per node:
// queue adds key i's commands to pipe and returns the one whose error
// tells how key i fared (sha: as EVALSHA, else as EVAL, for scripts; it is
// called again with sha false for keys a node answered NOSCRIPT). Keys
// whose node's breaker is open are not sent. Each node's breaker is told
// once what the pipeline says of it. It returns each key's error, judged
// as roundTrip judges it.
//
// single says that queue sends one command per key: then a batch of one
// key is sent to the client as it is, through roundTrip, since a pipeline
// of one command costs allocations and saves no round trip. (A load of one
// key is a batch of one: its lease and its store are such commands.)
func (c *Cache[T]) roundTripMany(ctx context.Context, op string, keys []string, single bool, queue func(ctx context.Context, pipe redis.Cmdable, i int, sha bool) redis.Cmder) []error {
	errs := make([]error, len(keys))
	switch {
	case len(keys) == 0:
		return errs
	case len(keys) == 1 && single:
		errs[0] = c.roundTrip(ctx, op, keys[0], c.policy(keys[0]), false, func(ctx context.Context) error {
			cmd := queue(ctx, c.rdb, 0, true)
			if isNoScript(cmd.Err()) {
				cmd = queue(ctx, c.rdb, 0, false)
			}
			return cmd.Err()
		})
		return errs
	}
	bud := c.budget(ctx, nil)
	defer bud.end()
	nb := c.batchNodes(bud, keys)
	pipe := c.rdb.Pipeline()
	cmds := make([]redis.Cmder, len(keys))
	for i, k := range keys {
		if op != opInvalidate && !nb.allowed(i) {
			errs[i] = circuitOpen(op, k, nb.of[i])
			continue
		}
		cmds[i] = queue(bud, pipe, i, true)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(bud) // each command carries its own error
		again := false
		for i, cmd := range cmds {
			if cmd != nil && isNoScript(cmd.Err()) {
				cmds[i] = queue(bud, pipe, i, false)
				again = true
			}
		}
		if again {
			_, _ = pipe.Exec(bud)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		o, err := c.judgeCall(ctx, bud, nb.of[i], op, keys[i], cmd.Err())
		nb.saw(i, o)
		if (o == failed || o == refusedConn) && err != nil && err != redis.Nil {
			c.redisFailed(c.policy(keys[i]), nb.of[i], err)
		}
		errs[i] = err
	}
	nb.feed()
	return errs
}

// isNoScript reports a node's answer that it has not seen a script yet.
func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// judgeCall judges what a Redis call made for caller, under bud, to node,
// says of the node, and returns the error its caller gets: see roundTrip.
//
// A call that ran out of its budget is judged by what the node's
// connections saw meanwhile (see conn.go), not by the clock alone. If a
// reply came back from the node after the call began, or no command has
// been waiting for a reply from it for half the budget, the node was not
// what the call waited on: this process was (a CPU, a pooled connection,
// a dial, the calls queued before it). Such a call is late: its caller
// gets an error, but the node is not blamed for it, not counted in
// RedisErrors and not told to the breaker. A node that is stopped, hung
// or cut off answers nothing while a command waits, so its calls are
// judged failed, one per budget, as before; one that refuses a connection
// is judged at the first refusal.
func (c *Cache[T]) judgeCall(caller context.Context, bud *budget, node *breaker, op, key string, err error) (outcome, error) {
	if err == nil || err == redis.Nil {
		return healthy, err
	}
	if cerr := caller.Err(); cerr != nil {
		// The caller's own deadline or cancellation, not Redis's.
		return neutral, keyErr(op, key, cerr)
	}
	if dl, ok := caller.Deadline(); ok && !time.Now().Before(dl) {
		// The caller's deadline has passed, and the connection's deadline,
		// which is the same, went off before its context's timer.
		return neutral, keyErr(op, key, context.DeadlineExceeded)
	}
	o := judgeRedis(err)
	d := bud.dialed.Load()
	if r := node.refusal.Load(); d == nil && r != nil && r.at >= bud.start.UnixNano() {
		d = r // a dial of go-redis's own, on the call's behalf
	}
	cause := err
	if d != nil && !errors.Is(err, d.err) {
		cause = &dialError{d: d, err: err, budget: c.redisTimeout}
	}
	switch {
	case o != failed:
	case refused(err) || d != nil && refused(d.err):
		o = refusedConn
	case d == nil && expired(err) && !node.unresponsive(bud):
		o, cause = late, &lateError{err: err, budget: bud.deadline.Sub(bud.start)}
	}
	return o, keyErr(op, key, redisErr(cause))
}

// expired reports whether err is a call's budget running out: a deadline
// on the socket, the call's context, or a wait for a pooled connection.
func expired(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.As(err, &ne) && ne.Timeout()
}

// A lateError is a call that ran out of its budget while its node was
// answering: see judgeCall.
type lateError struct {
	err    error
	budget time.Duration
}

func (e *lateError) Error() string {
	return fmt.Sprintf("%v (no reply within the Redis budget of %v, while the node answered other calls: this process was too busy to make the call in time)", e.err, e.budget)
}

func (e *lateError) Unwrap() error { return e.err }

// A dialError is a call that failed after a connection for it could not
// be made: it names the dial's failure first.
type dialError struct {
	d      *dialFailure
	err    error
	budget time.Duration
}

func (e *dialError) Error() string {
	if errors.Is(e.err, context.Canceled) {
		return fmt.Sprintf("%v (the call ended at the refusal)", e.d.err)
	}
	if errors.Is(e.err, context.DeadlineExceeded) {
		return fmt.Sprintf("%v (then the Redis budget of %v ran out)", e.d.err, e.budget)
	}
	return fmt.Sprintf("%v (then: %v)", e.d.err, e.err)
}

func (e *dialError) Unwrap() []error {
	if errors.Is(e.err, context.Canceled) {
		// The call was ended by the refusal itself (ticks.abort): the
		// refusal is the whole story, not a cancellation.
		return []error{e.d.err}
	}
	return []error{e.d.err, e.err}
}

// circuitOpen is the error of a call that did not try key's node because
// its breaker, b, is open: it names the refused connection that opened
// it, if one did.
func circuitOpen(op, key string, b *breaker) error {
	if r := b.refusal.Load(); r != nil && refused(r.err) && r.at >= b.opened.Load()-int64(b.cfg.cooldown) {
		return keyErr(op, key, &kindError{ErrRedis, &kindError{ErrCircuitOpen, r.err}})
	}
	return keyErr(op, key, &kindError{ErrRedis, ErrCircuitOpen})
}

// batchNodes is the breakers of a batch's keys: each node is asked once
// whether it may be tried, and told once what the batch says of it. ctx
// is the batch's budgeted context: finding a key's node can be a Redis
// call.
type batchNodes struct {
	of      []*breaker
	allow   map[*breaker]bool
	outcome map[*breaker]outcome
}

func (c *Cache[T]) batchNodes(ctx context.Context, keys []string) *batchNodes {
	nb := &batchNodes{of: make([]*breaker, len(keys)), allow: map[*breaker]bool{}, outcome: map[*breaker]outcome{}}
	for i, k := range keys {
		b := c.nodes.forKey(ctx, k)
		nb.of[i] = b
		if _, asked := nb.allow[b]; !asked {
			nb.allow[b] = b.allow()
		}
	}
	return nb
}

func (nb *batchNodes) allowed(i int) bool { return nb.allow[nb.of[i]] }

// saw records the outcome of key i's command: a node that failed any
// command failed the batch once; one whose caller gave up says nothing.
func (nb *batchNodes) saw(i int, o outcome) {
	b := nb.of[i]
	if cur, ok := nb.outcome[b]; !ok || o > cur {
		nb.outcome[b] = o
	}
}

func (nb *batchNodes) feed() {
	for b, o := range nb.outcome {
		b.feed(o)
	}
}

// A breaker stops calls from waiting on a Redis node that keeps failing:
// after cfg.failures consecutive failures it opens for cfg.cooldown, then
// lets one call through to probe. The probe's success closes it; its
// failure opens it again.
type breaker struct {
	mu        sync.Mutex // orders openings and closings, so observers see them in order
	cfg       breakerConfig
	addr      string   // the node's address, for observers; "" on a single node
	obs       Observer // told when it opens or closes; nil: nobody
	failures  atomic.Int64
	openUntil atomic.Int64 // unix nanoseconds; 0 when closed
	probeAt   atomic.Int64 // unix nanoseconds the probe began; 0 when none

	// What the node's connections saw (conn.go), in unix nanoseconds:
	// when a read last returned bytes, and when the first command written
	// since then was written (0: none is waiting).
	lastRead   atomic.Int64
	unanswered atomic.Int64
	refusal    atomic.Pointer[dialFailure] // the latest dial to the node that failed

	watched atomic.Int64                 // the node's connections that report (conn.go)
	pool    atomic.Pointer[redis.Client] // the node's client, for its pool's size; nil: unknown
	opened  atomic.Int64                 // unix nanoseconds the breaker last opened

	ticks   ticks         // the shared ends of the budgets of calls to the node
	slots   chan struct{} // one per call in flight to the node; nil: no bound
	waiting atomic.Int64  // calls waiting for a slot
}

// refusedDial notes a dial to the node that failed; a refused one opens
// the breaker and ends the node's calls under way (see ticks.abort).
func (b *breaker) refusedDial(f *dialFailure) {
	b.refusal.Store(f)
	if refused(f.err) {
		b.trip()
		b.ticks.abort()
	}
}

// answered notes a reply from the node at now: it is alive, and nothing
// written to it before now is waiting on a dead node.
func (b *breaker) answered(now int64) {
	b.lastRead.Store(now)
	if b.unanswered.Load() != 0 {
		b.unanswered.Store(0)
	}
}

// asked notes a command written to the node at now.
func (b *breaker) asked(now int64) {
	if b.unanswered.Load() == 0 {
		b.unanswered.CompareAndSwap(0, now)
	}
}

// unresponsive reports whether the node, rather than this process, is what
// a call under bud waited on: nothing came back from it since the call
// began, and a command has waited on it for at least half the budget.
//
// Only watched connections tell: if the node's pool holds connections
// made before the cache was (unwatched), the call may have used one, and
// an expiry with no reply from the node since the call began is taken as
// the node's, as if nothing were watched.
func (b *breaker) unresponsive(bud *budget) bool {
	if b.lastRead.Load() >= bud.start.UnixNano() {
		return false
	}
	if w := b.unanswered.Load(); w != 0 {
		return w <= bud.deadline.UnixNano()-int64(bud.deadline.Sub(bud.start))/2
	}
	cl := b.pool.Load()
	return cl == nil || int64(cl.PoolStats().TotalConns) > b.watched.Load()
}

// enter waits for one of the node's slots, so that no more calls ask the
// client for a connection to the node than its pool holds: the thousands
// of a surge wait here, where waiting is not charged to their budgets,
// rather than in the pool. It returns ctx's error if ctx ends first, or
// ErrClosed if the cache gives up on its calls (closing). A call that
// enters leaves.
func (b *breaker) enter(ctx context.Context, closing <-chan struct{}) error {
	if b.slots == nil {
		return nil
	}
	select {
	case b.slots <- struct{}{}:
		return nil
	default:
	}
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	select {
	case b.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closing:
		return ErrClosed
	}
}

func (b *breaker) leave() {
	if b.slots != nil {
		<-b.slots
	}
}

// allow reports whether a call may try the node.
func (b *breaker) allow() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	now := time.Now().UnixNano()
	if now < until {
		return false
	}
	// Half open: one probe at a time. A probe that never reported (its
	// caller gave up first) is replaced after a cool-down.
	p := b.probeAt.Load()
	if p != 0 && now-p < int64(b.cfg.cooldown) {
		return false
	}
	return b.probeAt.CompareAndSwap(p, now)
}

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.mu.Lock()
		if b.openUntil.Swap(0) != 0 {
			b.probeAt.Store(0)
			b.notify(false)
		}
		b.mu.Unlock()
	}
}

func (b *breaker) failure() {
	if b.cfg.failures <= 0 {
		return
	}
	if n := b.failures.Add(1); n >= int64(b.cfg.failures) || b.openUntil.Load() != 0 {
		b.open()
	}
}

// trip opens the breaker at once, for a failure that leaves no doubt: a
// refused connection.
func (b *breaker) trip() {
	if b.cfg.failures <= 0 {
		return
	}
	b.failures.Store(int64(b.cfg.failures))
	b.open()
}

// open opens the breaker for a cool-down from now, or, if it is open,
// starts its cool-down again.
func (b *breaker) open() {
	b.mu.Lock()
	now := time.Now()
	old := b.openUntil.Swap(now.Add(b.cfg.cooldown).UnixNano())
	if old == 0 {
		b.opened.Store(now.UnixNano())
	}
	b.probeAt.Store(0)
	if old == 0 {
		b.notify(true)
	}
	b.mu.Unlock()
}

func (b *breaker) notify(open bool) {
	if b.obs != nil {
		state := "closed"
		if open {
			state = "open"
		}
		b.obs.ObserveRedis(RedisEvent{Node: b.addr, Breaker: state})
	}
}

// nodes holds one breaker per Redis node. On a *redis.ClusterClient a key's
// node is its slot's master, as the client itself maps it; on any other
// client every key has the one node.
type nodes struct {
	cfg     breakerConfig
	obs     Observer
	step    int64 // the ticks' step
	pool    int   // the client's connections per node; 0: unknown
	cluster *redis.ClusterClient
	one     breaker // the node of a non-cluster client, and of keys whose master is unknown
	byAddr  sync.Map
}

func newNodes(rdb redis.UniversalClient, cfg breakerConfig, obs Observer, budget time.Duration) *nodes {
	n := &nodes{cfg: cfg, obs: obs, step: int64(max(budget/16, time.Millisecond))}
	n.cluster, _ = rdb.(*redis.ClusterClient)
	switch c := rdb.(type) {
	case *redis.Client:
		n.pool = c.Options().PoolSize
	case *redis.ClusterClient:
		n.pool = c.Options().PoolSize
	}
	n.init(&n.one, "")
	if c, ok := rdb.(*redis.Client); ok {
		n.one.addr = c.Options().Addr // "FailoverClient" through Sentinel
		n.one.pool.Store(c)
	}
	return n
}

// init readies a node's breaker.
func (n *nodes) init(b *breaker, addr string) {
	b.cfg, b.obs, b.addr = n.cfg, n.obs, addr
	b.ticks.step = n.step
	if n.pool > 0 {
		b.slots = make(chan struct{}, n.pool)
	}
}

// forKey returns the breaker of key's node. It costs a slot computation
// and a map read on a cluster, and nothing otherwise.
func (n *nodes) forKey(ctx context.Context, key string) *breaker {
	if n.cluster == nil {
		return &n.one
	}
	cl, err := n.cluster.MasterForKey(ctx, key)
	if err != nil {
		// No cluster state at all (no node answered): the failure that
		// follows is charged to the shared bucket.
		return &n.one
	}
	b := n.forAddr(cl.Options().Addr)
	if b.pool.Load() != cl {
		b.pool.Store(cl)
	}
	return b
}

// forAddr returns the breaker of the node at addr: on a Cluster, the
// master there; on any other client, the one node.
func (n *nodes) forAddr(addr string) *breaker {
	if n.cluster == nil {
		return &n.one
	}
	if b, ok := n.byAddr.Load(addr); ok {
		return b.(*breaker)
	}
	nb := &breaker{}
	n.init(nb, addr)
	b, _ := n.byAddr.LoadOrStore(addr, nb)
	return b.(*breaker)
}

// outcome is what one Redis operation says about its node's health.
type outcome uint8

const (
	healthy     outcome = iota // the node answered (a value, nil, or an error reply about the data)
	neutral                    // says nothing of the node: the caller's own context ended
	late                       // says nothing of the node: this process was too busy to make the call in time
	failed                     // the node's own failure
	refusedConn                // nothing listens at the node's address: open the breaker now
)

// judgeRedis classifies err from a Redis operation whose caller's context
// is still live (see judgeCall): the node answered, or it failed.
func judgeRedis(err error) outcome {
	if err == nil || err == redis.Nil {
		return healthy
	}
	var re redis.Error
	if errors.As(err, &re) {
		// An error reply: the node is up unless the reply says it cannot
		// serve (still loading its data set, cut off from the cluster or
		// its master).
		msg := re.Error()
		for _, p := range unavailableReplies {
			if strings.HasPrefix(msg, p) {
				return failed
			}
		}
		return healthy
	}
	// Network errors, refused connections, an exhausted pool, and the
	// cache's own budget running out (the caller's context is still live,
	// so a deadline error is the budget's).
	return failed
}

var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"}

// feed tells b what an operation's outcome says of its node.
func (b *breaker) feed(o outcome) {
	switch o {
	case healthy:
		b.success()
	case failed:
		b.failure()
	case refusedConn:
		b.trip()
	}
}
