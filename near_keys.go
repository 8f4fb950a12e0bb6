package packcache

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache/internal/tracking"
)

// The near cache's tracking, in call order: New asks the servers whether
// they accept CLIENT TRACKING and starts the invalidation stream
// (startTracker); under TrackKeys, a read that may fill the near cache runs
// on one of the stream's tracked connections (nearPipeline) and says
// whether Redis now tracks its key for this process (trackedEnd), which
// near.keepRead requires.

// startTracker starts the invalidation stream of the tracked near caches:
// broadcast for prefixes, and with keys, reader connections that track
// per key. A server that refuses CLIENT TRACKING fails it with an error
// matching ErrTrackingRefused; one that cannot be reached does not (the
// stream reports it, and the near cache does not serve meanwhile).
func startTracker(rdb redis.UniversalClient, h tracking.Handler, redisTimeout time.Duration, prefixes []string, interval time.Duration, keys bool, hooks []redis.Hook) (*tracking.Tracker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(redisTimeout, time.Second))
	err := tracking.Probe(ctx, rdb)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: %w; a near cache needs it (Redis 6.0 or later, or Valkey; an ACL user needs +client|tracking): "+
			"enable it, or set LocalCache.Untracked for a near cache bounded by time alone, or turn the near cache off", ErrTrackingRefused, err)
	}
	var tr *tracking.Tracker
	if keys {
		tr, err = tracking.NewKeys(rdb, prefixes, interval, h, hooks...)
	} else {
		tr, err = tracking.New(rdb, prefixes, interval, h)
	}
	if err != nil {
		return nil, fmt.Errorf("packcache: %w", err)
	}
	return tr, nil
}

// nearPipeline returns the pipeline of a read of key: under TrackKeys, a
// tracked one (see tracking.Tracker.Reader), with rd to end it with
// trackedEnd; else, or when no tracked connection can be had, the
// client's, whose value the near cache does not keep.
func (r *remote) nearPipeline(ctx context.Context, key string, p *policy, rp *reply) (redis.Pipeliner, *tracking.Read) {
	rp.tracked = false
	if p.near == nil || p.near.lc.Tracking != TrackKeys || rp.untracked || r.tracker == nil {
		return r.rdb.Pipeline(), nil
	}
	rd := r.tracker.Reader(ctx, key, rp.lease != "")
	if rd == nil {
		return r.rdb.Pipeline(), nil
	}
	return rd.Pipeline(), rd
}

// trackedEnd ends the tracked read rd (nil: the read was not one) whose
// command was cmd: it records in rp whether Redis tracks the key for this
// process, and reports whether the read must be made again on the client
// (the tracked connection could not be set up, or Redis answered with an
// error the client handles, such as a Cluster's redirection).
func trackedEnd(rd *tracking.Read, cmd redis.Cmder, rp *reply) (again bool) {
	if rd == nil {
		return false
	}
	rp.tracked, again = rd.End(cmd)
	rp.untracked = again
	return again
}
