package tracking

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tracking per key (OPTIN): with NewKeys, each listener also keeps a few
// reader connections to its master, on which CLIENT TRACKING is on in
// OPTIN mode, redirected to the listener's connection. A read made on one
// of them right after CLIENT CACHING yes makes Redis remember that this
// process holds the key, and send the listener its next invalidation;
// keys this process never read cost it nothing.
//
// Redis remembers a tracked key by the connection that read it: once that
// connection closes, a write of the key is told to nobody. So the readers
// are connections this package holds, never returned to a pool, and:
//
//   - a reader that fails (any failure of the connection, not an error
//     reply) is dropped and the near cache emptied (Handler.Flush);
//   - every heartbeat proves the readers alive too: each reader that ever
//     connected is sent a PING first, and the heartbeat's proof counts
//     from when those PINGs were sent (see listener.readersProven), so a
//     reader Redis closed without telling us (CLIENT KILL, the timeout
//     setting) closes the gates within MaxLag, as a lost listener does;
//   - the readers of a listener's connection redirect to that connection
//     alone: when it (re)subscribes, its readers are replaced, before the
//     near cache is emptied.

// readersPerMaster is how many reads that fill the near cache run at once
// on one master.
const readersPerMaster = 4

// errArm marks a reader connection that could not be given tracking: the
// read is made on the application's client instead, and fills no near
// cache.
var errArm = errors.New("tracking: reader not armed")

// A readers is the reader connections of one listener's connection.
type readers struct {
	client *redis.Client
	free   chan *reader
	closed chan struct{}
}

type reader struct {
	conn *redis.Conn
	used bool // it has been given a command, so may hold tracked keys
}

// newReaders makes the readers of the listener connection id, on the
// server of run_id run ("" when it is not checked), dialled with opt.
func (tr *Tracker) newReaders(opt redis.Options, id int64, run string) *readers {
	o := opt
	userConnect := o.OnConnect
	o.ClientName = "packcache-tracked-read"
	o.Protocol = 2 // no push messages: invalidations go to the listener
	o.ContextTimeoutEnabled = true
	Own(&o)
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = readersPerMaster, 0, readersPerMaster
	o.ConnMaxIdleTime, o.ConnMaxLifetime = -1, 0
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userConnect != nil {
			if err := userConnect(ctx, cn); err != nil {
				return err
			}
		}
		if run != "" {
			got, err := runID(ctx, cn)
			if err != nil {
				return err
			}
			if got != run {
				return fmt.Errorf("%w: the server %s is not the listener's", errArm, got)
			}
		}
		if err := cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "OPTIN").Err(); err != nil {
			return fmt.Errorf("%w: CLIENT TRACKING on REDIRECT %d OPTIN: %v", errArm, id, err)
		}
		return nil
	}
	rs := &readers{client: redis.NewClient(&o), free: make(chan *reader, readersPerMaster), closed: make(chan struct{})}
	for _, h := range tr.hooks {
		rs.client.AddHook(h)
	}
	for range readersPerMaster {
		rs.free <- &reader{conn: rs.client.EphemeralConn()}
	}
	return rs
}

func (rs *readers) close() {
	close(rs.closed)
	rs.client.Close()
}

// A Read is one tracked read: its pipeline runs on a reader connection,
// after CLIENT CACHING yes. End must be called once it ran.
type Read struct {
	tr   *Tracker
	rs   *readers
	r    *reader
	pipe redis.Pipeliner
	// caching is the CLIENT CACHING yes; probe, where the read's command
	// is a write (SET ... GET, which Redis does not track), the EXISTS
	// that tracks the key just before it.
	caching, probe *redis.Cmd
}

// Pipeline is the read's pipeline: the caller queues its commands, and
// calls Exec.
func (rd *Read) Pipeline() redis.Pipeliner { return rd.pipe }

// Reader returns a tracked read of key, under CLIENT CACHING yes, on a
// reader connection to key's master; nil when there is none to be had
// (not NewKeys, the master's listener not subscribed, every reader busy):
// the key is then read as without tracking, and must not enter a near
// cache. write says that the read's command is a
// write (SET ... GET): Redis tracks only read-only commands, so an
// EXISTS of key, which is, comes first.
func (tr *Tracker) Reader(ctx context.Context, key string, write bool) *Read {
	if !tr.keys {
		return nil
	}
	l := tr.listenerFor(ctx, key)
	if l == nil || !l.subscribed.Load() {
		return nil
	}
	rs := l.readers.Load()
	if rs == nil {
		return nil
	}
	// Never wait for a reader: a read waiting would spend its caller's
	// budget; it is made on the application's client instead.
	var r *reader
	select {
	case r = <-rs.free:
	default:
		return nil
	}
	rd := &Read{tr: tr, rs: rs, r: r, pipe: r.conn.Pipeline()}
	r.used = true
	rd.caching = rd.pipe.Do(ctx, "CLIENT", "CACHING", "yes")
	if write {
		rd.probe = rd.pipe.Do(ctx, "EXISTS", key)
	}
	return rd
}

// End gives the reader back, and reports whether the read was tracked:
// CLIENT CACHING yes (and the probe) ran. cmd is the read's command. A
// reader that could not be armed is dropped, and so is one whose
// connection failed, emptying the near cache first (the keys it tracked
// are no longer tracked). retry says that the read must be made again
// without tracking, on the application's client, which knows how to
// handle what went wrong: the reader could not be armed, its connection
// failed, or Redis answered with an error (a redirection on a Cluster,
// say).
func (rd *Read) End(cmd redis.Cmder) (tracked, retry bool) {
	err := rd.caching.Err()
	if err == nil && rd.probe != nil {
		err = rd.probe.Err()
	}
	cerr := cmd.Err()
	var rerr redis.Error
	switch {
	case err == nil && (cerr == nil || cerr == redis.Nil):
		tracked = true
	case errors.Is(err, errArm) || errors.Is(cerr, errArm):
		retry = true
		rd.replace(false)
		return false, true
	case err == nil && errors.As(cerr, &rerr):
		retry = true
	case err != nil && errors.As(err, &rerr):
		// Redis refused CLIENT CACHING: the connection is not tracking.
		rd.replace(true)
		return false, true
	default:
		// The connection failed (Redis closed it, or the read ran out of
		// time): whatever it tracked is lost, and the read is made again
		// on the application's client, as its own failure would be.
		rd.replace(true)
		return false, true
	}
	rd.rs.free <- rd.r
	return tracked, retry
}

// replace drops rd's reader and puts a fresh one in its place, emptying
// the near cache first when flush says that the dropped one may have
// tracked keys.
func (rd *Read) replace(flush bool) {
	_ = rd.r.conn.Close()
	if flush {
		rd.tr.h.Flush()
	}
	select {
	case <-rd.rs.closed:
	default:
		rd.rs.free <- &reader{conn: rd.rs.client.EphemeralConn()}
	}
}

// pingReaders proves l's readers alive: it sends a PING through each that
// ever connected, and returns when they were sent, or 0 if one failed
// (its keys are no longer tracked: it is replaced and the near cache
// emptied) or could not be had within the heartbeat interval.
func (tr *Tracker) pingReaders(ctx context.Context, l *listener) int64 {
	rs := l.readers.Load()
	if rs == nil {
		return 0
	}
	sent := int64(time.Since(tr.epoch))
	ctx, cancel := context.WithTimeout(ctx, tr.interval)
	defer cancel()
	var held []*reader
	defer func() {
		for _, r := range held {
			rs.free <- r
		}
	}()
	for range readersPerMaster {
		var r *reader
		select {
		case r = <-rs.free:
		case <-ctx.Done():
			return 0
		}
		held = append(held, r)
		if !r.used {
			continue
		}
		if err := r.conn.Ping(ctx).Err(); err != nil {
			rd := &Read{tr: tr, rs: rs, r: r}
			held = held[:len(held)-1]
			rd.replace(true)
			return 0
		}
	}
	return sent
}

// listenerFor returns the listener of key's master.
func (tr *Tracker) listenerFor(ctx context.Context, key string) *listener {
	ls := *tr.current.Load()
	if tr.cluster == nil {
		if len(ls) == 1 {
			return ls[0]
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	m, err := tr.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil
	}
	addr := m.Options().Addr
	for _, l := range ls {
		if l.addr == addr {
			return l
		}
	}
	return nil
}
