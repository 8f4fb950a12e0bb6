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

	deadline time.Time
	tick     *tick              // the shared Done, when the caller's context cannot end
	cancel   context.CancelFunc // the WithDeadline context's, otherwise
	nodes    *nodes             // the breakers, for the dial hook
	dialed   atomic.Pointer[dialFailure]
}

type budgetKey struct{}

// A dialFailure is a connection to addr that could not be made during a
// call: the cause of its failure, which go-redis does not return when the
// budget runs out while it retries.
type dialFailure struct {
	addr string
	err  error
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
	end int64 // unix nanoseconds
	ch  chan struct{}
}

// ticks hands out the shared ends of budgets. As every budget is as long
// as every other, their deadlines come in the order they began, and one
// tick serves all the budgets begun within a sixteenth of the budget.
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
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { close(nt.ch) })
			return nt
		}
		if k.cur.CompareAndSwap(t, nt) {
			time.AfterFunc(time.Until(time.Unix(0, nt.end)), func() { close(nt.ch) })
			return nt
		}
	}
}

// budget returns the context of one Redis call made for ctx: ctx bounded
// by the cache's Redis time budget, unless ctx's own deadline comes first.
// The caller calls end when the call is done.
func (c *Cache[T]) budget(ctx context.Context) *budget {
	now := time.Now()
	b := &budget{Context: ctx, nodes: c.nodes}
	b.deadline = now.Add(c.redisTimeout)
	if ctx.Done() == nil {
		b.tick = c.ticks.by(b.deadline.UnixNano())
		return b
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(b.deadline) {
		b.deadline = dl
		return b
	}
	b.Context, b.cancel = context.WithDeadline(ctx, b.deadline)
	return b
}

// dialHook tells the budget of the call that made a connection when the
// connection failed: New adds it to the client (and to each node's client
// of a Cluster). It changes nothing else: commands and pipelines pass
// through untouched.
type dialHook struct{}

func (dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			if b, ok := ctx.Value(budgetKey{}).(*budget); ok {
				b.dialed.Store(&dialFailure{addr: addr, err: err})
				if refused(err) {
					// Nothing listens there: a definite failure, not one
					// to be counted towards the threshold while every
					// call waits out its budget on go-redis's retries.
					b.nodes.forAddr(addr).trip()
				}
			}
		}
		return conn, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookDials adds dialHook to rdb: to each node's client on a Cluster, as
// the cluster's own hooks do not see its nodes' dials. (Nodes a Cluster
// client made before New are not hooked: their dial failures are reported
// by the budget running out, as before.)
func hookDials(rdb redis.UniversalClient) {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(dialHook{}) })
	default:
		rdb.AddHook(dialHook{})
	}
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
func (c *Cache[T]) roundTrip(ctx context.Context, op, key string, p *policy[T], f func(context.Context) error) error {
	bud := c.budget(ctx)
	defer bud.end()
	b := c.nodes.forKey(bud, key)
	if op != opInvalidate && !b.allow() {
		return circuitOpen(op, key)
	}
	o, err := c.judgeCall(ctx, bud, op, key, f(bud))
	b.feed(o)
	if o != neutral && err != nil && err != redis.Nil {
		c.redisFailed(p, b, err)
	}
	return err
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
		errs[0] = c.roundTrip(ctx, op, keys[0], c.policy(keys[0]), func(ctx context.Context) error {
			cmd := queue(ctx, c.rdb, 0, true)
			if isNoScript(cmd.Err()) {
				cmd = queue(ctx, c.rdb, 0, false)
			}
			return cmd.Err()
		})
		return errs
	}
	bud := c.budget(ctx)
	defer bud.end()
	nb := c.batchNodes(bud, keys)
	pipe := c.rdb.Pipeline()
	cmds := make([]redis.Cmder, len(keys))
	for i, k := range keys {
		if op != opInvalidate && !nb.allowed(i) {
			errs[i] = circuitOpen(op, k)
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
		o, err := c.judgeCall(ctx, bud, op, keys[i], cmd.Err())
		nb.saw(i, o)
		if o != neutral && err != nil && err != redis.Nil {
			c.redisFailed(c.policy(keys[i]), nb.of[i], err)
		}
		errs[i] = err
	}
	nb.feed()
	return errs
}

// isNoScript reports a node's answer that it has not seen a script yet.
func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// judgeCall judges what a Redis call made for caller, under bud, says of
// its node, and returns the error its caller gets: see roundTrip.
func (c *Cache[T]) judgeCall(caller context.Context, bud *budget, op, key string, err error) (outcome, error) {
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
	cause := err
	if d := bud.dialed.Load(); d != nil && !errors.Is(err, d.err) {
		cause = &dialError{d: d, err: err, budget: c.redisTimeout}
	}
	if o == failed && (refused(err) || bud.dialed.Load() != nil && refused(bud.dialed.Load().err)) {
		o = refusedConn
	}
	return o, keyErr(op, key, redisErr(cause))
}

// A dialError is a call that failed after a connection for it could not
// be made: it names the dial's failure first.
type dialError struct {
	d      *dialFailure
	err    error
	budget time.Duration
}

func (e *dialError) Error() string {
	if errors.Is(e.err, context.DeadlineExceeded) {
		return fmt.Sprintf("%v (then the Redis budget of %v ran out)", e.d.err, e.budget)
	}
	return fmt.Sprintf("%v (then: %v)", e.d.err, e.err)
}

func (e *dialError) Unwrap() []error { return []error{e.d.err, e.err} }

// circuitOpen is the error of a call that did not try key's node because
// its breaker is open.
func circuitOpen(op, key string) error {
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
	old := b.openUntil.Swap(time.Now().Add(b.cfg.cooldown).UnixNano())
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
	cluster *redis.ClusterClient
	one     breaker // the node of a non-cluster client, and of keys whose master is unknown
	byAddr  sync.Map
}

func newNodes(rdb redis.UniversalClient, cfg breakerConfig, obs Observer) *nodes {
	n := &nodes{cfg: cfg, obs: obs}
	n.one.cfg, n.one.obs = cfg, obs
	n.cluster, _ = rdb.(*redis.ClusterClient)
	if c, ok := rdb.(*redis.Client); ok {
		n.one.addr = c.Options().Addr // "FailoverClient" through Sentinel
	}
	return n
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
	return n.forAddr(cl.Options().Addr)
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
	b, _ := n.byAddr.LoadOrStore(addr, &breaker{cfg: n.cfg, addr: addr, obs: n.obs})
	return b.(*breaker)
}

// outcome is what one Redis operation says about its node's health.
type outcome uint8

const (
	healthy     outcome = iota // the node answered (a value, nil, or an error reply about the data)
	neutral                    // says nothing of the node: the caller's own context ended
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
