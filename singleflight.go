package packcache

// Coalescing, where concurrent callers share work, is internal/singleflight:
// the reads of Get, GetOrLoad and Serve are shared by a
// singleflight.Group (c.lookups, c.reads), their work being flight.Run
// (read.go); the loads are shared by a singleflight.Registry (c.loads),
// among the reads that found the same state of a key (loader.go); the
// dictionary set's fetches are a Group too (internal/dictset). The cache
// calls it directly; what it adds is the error a panic in shared work
// becomes (panicError, errors.go), and below, the cache's life as the
// Groups' goroutines' register.

// spawns is the cache's life as a Group's goroutines register with it.
type spawns struct{ l *life }

func (s spawns) TrySpawn() bool { return s.l.trySpawn() }
func (s spawns) Exit()          { s.l.exit() }
