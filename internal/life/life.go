// Package life counts what a cache has under way, its calls and the
// goroutines they start, so that Close can refuse new calls and wait for
// those under way. The cache's calls register with it, and so do the
// goroutines that internal/singleflight starts for shared reads, without
// a round trip through the cache.
package life

import (
	"sync"
	"sync/atomic"
)

// A Life counts the calls and goroutines under way. Init readies it.
type Life struct {
	// state is closed once Close has begun, plus the number of calls and
	// goroutines under way.
	state atomic.Int64
	idle  chan struct{} // closed when, after Close, nothing is under way
	once  sync.Once

	// Go's goroutines, parked between pieces of work (see Go).
	work    chan func()   // hands work to a parked goroutine; unbuffered
	parked  atomic.Int32  // goroutines parked now
	closing chan struct{} // closed when Close begins: parked goroutines end
	stop    sync.Once
}

// closed is added to a Life's state once Close has begun.
const closed = 1 << 62

// Init readies l; it is called before l is used.
func (l *Life) Init() {
	l.idle = make(chan struct{})
	l.work = make(chan func())
	l.closing = make(chan struct{})
}

// Enter registers a call, unless Close has begun.
func (l *Life) Enter() bool {
	if l.state.Add(1)&closed != 0 {
		l.Exit()
		return false
	}
	return true
}

// Exit ends a call or a goroutine.
func (l *Life) Exit() {
	if l.state.Add(-1) == closed {
		l.once.Do(func() { close(l.idle) })
	}
}

// Spawn registers a goroutine started by a call or goroutine under way,
// whose own registration keeps Close waiting: so it may start even after
// Close has begun.
func (l *Life) Spawn() { l.state.Add(1) }

// TrySpawn is Spawn for work that a caller could as well do itself: it
// refuses once Close has begun.
func (l *Life) TrySpawn() bool {
	if l.state.Load()&closed != 0 {
		return false
	}
	l.Spawn()
	return true
}

// Close refuses calls from now on, and TrySpawn's goroutines, and returns
// a channel closed once nothing is under way. It may be called more than
// once, and concurrently.
func (l *Life) Close() <-chan struct{} {
	l.stop.Do(func() { close(l.closing) })
	if old := l.state.Or(closed); old&^closed == 0 {
		l.once.Do(func() { close(l.idle) })
	}
	return l.idle
}

// Running is the number of calls and goroutines under way.
func (l *Life) Running() int64 { return l.state.Load() &^ closed }
