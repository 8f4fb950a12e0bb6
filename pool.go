package packcache

import "sync"

// maxPooled is the largest buffer kept for reuse: a rare huge value should
// not pin its memory in the pool.
const maxPooled = 8 << 20

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}
