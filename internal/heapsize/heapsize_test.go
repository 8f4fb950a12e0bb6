package heapsize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	gojson "github.com/goccy/go-json"
)

// TestSizeClasses: the table and the rounding of large objects agree with
// the running runtime, which rounds a slice grown by append to what it
// allocates for it.
func TestSizeClasses(t *testing.T) {
	for _, n := range []int{tinySize, 17, 100, 1000, 4097, 30000, maxSmallSize - 1, maxSmallSize, maxSmallSize + 1, 100000, 1 << 20} {
		want := cap(append([]byte(nil), make([]byte, n)...))
		if got := Alloc(uintptr(n), false); got != int64(want) {
			t.Errorf("Alloc(%d) = %d, the runtime allocates %d", n, got, want)
		}
	}
	for _, c := range classSizes {
		for _, n := range []int{int(c) - 1, int(c), int(c) + 1} {
			if n < tinySize || n > maxSmallSize {
				continue
			}
			want := cap(append([]byte(nil), make([]byte, n)...))
			if got := Alloc(uintptr(n), false); got != int64(want) {
				t.Errorf("Alloc(%d) = %d, the runtime allocates %d", n, got, want)
			}
		}
	}
}

// heap returns the bytes of live heap, after two collections (the second
// frees what the first left for sync.Pool's victim caches).
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

type Row struct {
	ID     int64    `json:"id"`
	Name   string   `json:"name"`
	Score  float64  `json:"score"`
	Active bool     `json:"active"`
	Tags   []string `json:"tags"`
	Note   *string  `json:"note"`
}

func rowsJSON(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"name":"user-%d-%s","score":%.3f,"active":%t,"tags":[`, i, r.IntN(1e6), strings.Repeat("x", r.IntN(40)), r.Float64()*100, r.IntN(2) == 0)
		for j := range r.IntN(4) {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"tag%d"`, r.IntN(100))
		}
		b.WriteString(`],"note":`)
		if r.IntN(3) == 0 {
			fmt.Fprintf(&b, `"note %d"`, i)
		} else {
			b.WriteString("null")
		}
		b.WriteByte('}')
	}
	b.WriteByte(']')
	return []byte(b.String())
}

// shapes are values of the kinds a cache holds, each made afresh by its
// function.
var shapes = []struct {
	name string
	make func(seed uint64) any
}{
	{"any from go-json", func(seed uint64) any {
		v := new(any)
		if err := gojson.Unmarshal(rowsJSON(seed, 200), v); err != nil {
			panic(err)
		}
		return v
	}},
	{"any from encoding/json", func(seed uint64) any {
		v := new(any)
		if err := json.Unmarshal(rowsJSON(seed, 200), v); err != nil {
			panic(err)
		}
		return v
	}},
	{"[]Row from go-json", func(seed uint64) any {
		v := new([]Row)
		if err := gojson.Unmarshal(rowsJSON(seed, 200), v); err != nil {
			panic(err)
		}
		return v
	}},
	{"[]*Row from go-json", func(seed uint64) any {
		v := new([]*Row)
		if err := gojson.Unmarshal(rowsJSON(seed, 200), v); err != nil {
			panic(err)
		}
		return v
	}},
	{"map[string]Row", func(seed uint64) any {
		var rows []Row
		if err := gojson.Unmarshal(rowsJSON(seed, 300), &rows); err != nil {
			panic(err)
		}
		m := map[string]Row{}
		for i, r := range rows {
			m[fmt.Sprintf("row-%d", i)] = r
		}
		return &m
	}},
	{"map[int64]float64 of 5000", func(seed uint64) any {
		m := map[int64]float64{}
		for i := range 5000 {
			m[int64(i)*int64(seed+1)] = float64(i)
		}
		return &m
	}},
	{"small maps", func(seed uint64) any {
		v := make([]map[string]int, 100)
		for i := range v {
			v[i] = map[string]int{}
			for j := range i % 12 {
				v[i][fmt.Sprint(j)] = j
			}
		}
		return &v
	}},
	{"[]byte with spare capacity", func(seed uint64) any {
		b := make([]byte, 1000, 50000+int(seed)%7)
		return &b
	}},
	{"map[string]any of msgpack's numbers", func(seed uint64) any {
		v := make([]any, 0, 500)
		for i := range 500 {
			n := 1000 + i + int(seed)
			v = append(v, map[string]any{
				"i16": int16(n), "i32": int32(n) << 8, "i64": int64(n) << 40, "u32": uint32(n) << 8,
				"f32": float32(n) + 0.5, "i8": int8(i), "b": i%2 == 0, "nil": nil,
			})
		}
		var x any = v
		return &x
	}},
	{"[]any of floats and strings", func(seed uint64) any {
		v := make([]any, 0, 3000)
		for i := range 1500 {
			v = append(v, float64(i)+0.5, fmt.Sprintf("string number %d", i))
		}
		return &v
	}},
}

// TestAgainstHeap: for each shape, the estimate of many values agrees with
// what holding them adds to the heap, within 20%.
func TestAgainstHeap(t *testing.T) {
	const count = 200
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			held := make([]any, count)
			s.make(0) // what the first call sets up (a decoder's caches)
			before := heap()
			for i := range held {
				held[i] = s.make(uint64(i))
			}
			after := heap()
			var est int64
			for _, v := range held {
				est += Of(v, 0)
			}
			runtime.KeepAlive(held)
			grew := int64(after) - int64(before)
			ratio := float64(est) / float64(grew)
			t.Logf("%d values: heap grew %d bytes, estimated %d (%.2f)", count, grew, est, ratio)
			if ratio < 0.8 || ratio > 1.2 {
				t.Errorf("estimated %d bytes, the heap grew %d: off by more than 20%%", est, grew)
			}
		})
	}
}

// TestSharedAndCycles: a pointer reached twice counts once; a cycle ends.
func TestSharedAndCycles(t *testing.T) {
	type node struct {
		_    [100]byte
		next *node
	}
	a := &node{}
	b := &node{next: a}
	a.next = b
	one := Of(a, 0)
	if want := 2 * Alloc(unsafe.Sizeof(node{}), true); one != want {
		t.Errorf("a cycle of two nodes: %d bytes, want %d", one, want)
	}
	pair := []*node{a, a}
	if got := Of(&pair, 0); got != Of(a, 0)+Alloc(16, true)+Alloc(24, true) {
		t.Errorf("a pointer held twice: %d bytes", got)
	}
	// A slice that holds itself: counted until the limit or the depth
	// bound, then stopped.
	s := []any{nil}
	s[0] = s
	if got := Of(s, 1<<20); got < maxDepth*16 {
		t.Errorf("a slice that holds itself: %d bytes, want each lap counted until the walk stops", got)
	}
	if got := Of(s, 1000); got <= 1000 || got > 2000 {
		t.Errorf("a slice that holds itself, with a limit of 1000: %d bytes, want the walk stopped just past it", got)
	}
}

// TestUnexported: maps, slices and pointers behind unexported fields are
// counted, without a panic.
func TestUnexported(t *testing.T) {
	type inner struct{ m map[string]string }
	type outer struct {
		in  inner
		any any
	}
	v := outer{in: inner{m: map[string]string{"k": strings.Repeat("v", 1000)}}, any: inner{m: map[string]string{"a": "b"}}}
	if got := Of(&v, 0); got < 1000 {
		t.Errorf("a struct of unexported fields: %d bytes", got)
	}
}

// TestLimit: the walk stops soon after the limit.
func TestLimit(t *testing.T) {
	v := make([]string, 10000)
	for i := range v {
		v[i] = strings.Repeat("x", 1000)
	}
	full := Of(&v, 0)
	part := Of(&v, 100000)
	if part <= 100000 || part > 200000+Alloc(uintptr(len(v)*16), true) {
		t.Errorf("with a limit of 100000: %d bytes (%d in all)", part, full)
	}
}

// BenchmarkOf compares the walk with the decode that made the value.
func BenchmarkOf(b *testing.B) {
	data := rowsJSON(1, 1000) // about 100 KB
	for _, s := range []struct {
		name string
		new  func() any
	}{
		{"any", func() any { return new(any) }},
		{"[]Row", func() any { return new([]Row) }},
	} {
		v := s.new()
		if err := gojson.Unmarshal(data, v); err != nil {
			b.Fatal(err)
		}
		b.Run(s.name+"/decode", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := gojson.Unmarshal(data, s.new()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(s.name+"/weigh", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				Of(v, 0)
			}
		})
	}
}
