package life

import "time"

// A goroutine Go started parks, once its work is done, for up to parkFor
// waiting for more, and at most maxParked park at once. A load per miss
// then runs on a goroutine whose stack has already grown to what a load
// needs (go-redis, a codec, the serializer), not on a new one that grows
// its stack again, copying it at each doubling: at 1.1 KB values that
// copying was a tenth of a miss's CPU. parkFor is short, so a parked
// goroutine outlives its work briefly even in a process that never calls
// Close, and maxParked bounds the stacks kept after a surge of loads.
const (
	parkFor   = 100 * time.Millisecond
	maxParked = 64
)

// Go runs f on a goroutine registered with l, as Spawn registers one: it
// may start even after Close has begun, and Close waits for it. The
// goroutine is one parked after earlier work when there is one, else a
// new one. f may call runtime.Goexit; the goroutine then ends with it.
func (l *Life) Go(f func()) {
	select {
	case l.work <- f:
		return
	default:
	}
	l.Spawn()
	go l.run(f)
}

// TryGo is Go for work that a caller could as well do itself: it refuses,
// reporting false, once Close has begun.
func (l *Life) TryGo(f func()) bool {
	if l.state.Load()&closed != 0 {
		return false
	}
	l.Go(f)
	return true
}

// run does f, then parks for more work until parkFor passes with none,
// or Close begins.
func (l *Life) run(f func()) {
	defer l.Exit()
	var t *time.Timer
	for {
		f()
		f = nil // not kept alive while parked
		if l.parked.Add(1) > maxParked {
			l.parked.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(parkFor)
		} else {
			t.Reset(parkFor)
		}
		select {
		case f = <-l.work:
		case <-t.C:
		case <-l.closing:
		}
		l.parked.Add(-1)
		if f == nil {
			t.Stop()
			return
		}
	}
}
