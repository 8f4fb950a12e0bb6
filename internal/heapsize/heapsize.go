// Package heapsize estimates the heap memory a value keeps alive: what a
// cache holding the value pays for it, which for a decoded document is
// often several times its serialized length.
//
// The estimate walks the value by reflection and adds up the allocations
// it reaches, each rounded up as the Go runtime's allocator rounds it (its
// size classes, the 8-byte header of a small object with pointers over 512
// bytes, whole pages for a large object):
//
//   - a string's bytes, and a slice's backing array by its capacity, not
//     its length;
//   - a pointer's target, counted once however many pointers reach it;
//   - a map's header and its groups of slots, as Go's Swiss tables lay them
//     out (estimated from the count of entries: a map grown by inserts has
//     between 7/16 and 7/8 of its slots full), and what its keys and
//     values reach;
//   - an interface's boxed value, when its dynamic type is not a pointer,
//     map, channel or function.
//
// Channels and functions are not followed, nor memory outside the heap
// told from the heap (a pointer to a global counts as an allocation): the
// estimate errs on the side of more. Shared backing arrays of slices and
// strings are counted for each slice or string: decoders do not make them.
package heapsize

import (
	"reflect"
	"sync"
	"unsafe"
)

// maxDepth bounds the nesting the walk follows: deeper parts of a value
// are not counted (decoders refuse such documents long before).
const maxDepth = 10000

// Of returns the bytes of heap the value v keeps alive, counting v as an
// interface holds it: a pointer's target, or v boxed if v is not
// pointer-shaped. It stops counting once the total passes limit, and then
// returns a number over limit, so that a caller that only needs to know
// whether a value fits pays for no more of it than fits. A limit of 0 or
// less means none.
func Of(v any, limit int64) int64 {
	if v == nil {
		return 0
	}
	w := walker{limit: limit}
	if limit <= 0 {
		w.limit = 1<<63 - 1
	}
	w.anyValue(v, 0)
	return w.n
}

// Bytes returns the heap a byte slice's backing array occupies: its
// capacity, rounded up as the allocator rounds it.
func Bytes(b []byte) int64 { return Alloc(uintptr(cap(b)), false) }

// Alloc returns the bytes the allocator takes for an object of size bytes,
// with or without pointers.
func Alloc(size uintptr, pointers bool) int64 {
	switch {
	case size == 0:
		return 0
	case size < tinySize && !pointers:
		// The tiny allocator packs small objects without pointers into
		// 16-byte blocks.
		return int64(size)
	case size > maxSmallSize-mallocHeader:
		return int64((size + pageSize - 1) &^ (pageSize - 1))
	}
	if pointers && size > minSizeForMallocHeader {
		size += mallocHeader
	}
	return int64(classSize(size))
}

// The allocator's constants, for 64-bit platforms.
const (
	tinySize               = 16
	maxSmallSize           = 32768
	pageSize               = 8192
	mallocHeader           = 8
	minSizeForMallocHeader = 512
)

// classSizes are the runtime's size classes for small objects, in bytes
// (runtime/sizeclasses.go; TestSizeClasses checks them against the
// running runtime).
var classSizes = [...]uint16{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224,
	240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768,
	896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200,
	3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240,
	10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576,
	27264, 28672, 32768,
}

// classSize returns the smallest size class of at least size bytes
// (0 < size <= maxSmallSize).
func classSize(size uintptr) uintptr {
	lo, hi := 0, len(classSizes)-1
	for lo < hi {
		m := (lo + hi) / 2
		if uintptr(classSizes[m]) < size {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return uintptr(classSizes[lo])
}

// A walker adds up the allocations a value reaches.
type walker struct {
	n, limit int64
	seen     map[unsafe.Pointer]struct{} // pointer targets and maps counted
	// keys and elems are reusable values for iterating maps, by type, so
	// that reading a map's entries allocates nothing per entry.
	keys, elems map[reflect.Type]reflect.Value
}

func (w *walker) add(n int64) { w.n += n }

func (w *walker) full() bool { return w.n > w.limit }

// once reports whether p is met for the first time.
func (w *walker) once(p unsafe.Pointer) bool {
	if w.seen == nil {
		w.seen = make(map[unsafe.Pointer]struct{})
	}
	if _, ok := w.seen[p]; ok {
		return false
	}
	w.seen[p] = struct{}{}
	return true
}

// iface counts what an interface holding v reaches: v's box, unless v is
// pointer-shaped, and what v reaches.
func (w *walker) iface(v reflect.Value, depth int) {
	if !v.IsValid() {
		return
	}
	t := v.Type()
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
	default:
		w.add(Alloc(t.Size(), infoOf(t).pointers))
	}
	w.value(v, depth)
}

// value counts what v reaches beyond the memory v itself occupies.
func (w *walker) value(v reflect.Value, depth int) {
	if depth > maxDepth || w.full() {
		return
	}
	switch v.Kind() {
	case reflect.String:
		w.add(Alloc(uintptr(v.Len()), false))
	case reflect.Slice:
		if v.IsNil() {
			return
		}
		et := v.Type().Elem()
		ei := infoOf(et)
		w.add(Alloc(uintptr(v.Cap())*et.Size(), ei.pointers))
		if ei.walk {
			for i, n := 0, v.Len(); i < n && !w.full(); i++ {
				w.value(v.Index(i), depth+1)
			}
		}
	case reflect.Array:
		if infoOf(v.Type().Elem()).walk {
			for i, n := 0, v.Len(); i < n && !w.full(); i++ {
				w.value(v.Index(i), depth+1)
			}
		}
	case reflect.Struct:
		for _, i := range infoOf(v.Type()).fields {
			w.value(v.Field(i), depth+1)
		}
	case reflect.Pointer:
		if v.IsNil() || !w.once(v.UnsafePointer()) {
			return
		}
		et := v.Type().Elem()
		w.add(Alloc(et.Size(), infoOf(et).pointers))
		w.value(v.Elem(), depth+1)
	case reflect.Interface:
		switch {
		case v.IsNil():
		case v.NumMethod() == 0 && v.CanInterface():
			w.anyValue(v.Interface(), depth+1) // the value held, not a copy
		default:
			w.iface(v.Elem(), depth+1)
		}
	case reflect.Map:
		// Not checked against the maps met already: decoders make no
		// shared maps, and a map met twice is counted twice, erring on
		// the side of more. A map that holds itself is stopped by the
		// limit or the depth.
		if !v.IsNil() {
			w.mapValue(v, depth)
		}
	}
}

// anyValue counts what an interface holding x reaches, for the types
// decoders put in an any (maps of strings to any, slices of any, strings,
// numbers, booleans) without reflection, which costs several times more
// per node of such a tree; other types through reflection.
func (w *walker) anyValue(x any, depth int) {
	if depth > maxDepth || w.full() {
		return
	}
	switch x := x.(type) {
	case nil, bool, int8, uint8:
		// Single bytes are boxed in the runtime's static memory.
	case string:
		w.add(Alloc(16, true) + Alloc(uintptr(len(x)), false))
	case float64, int64, uint64, int, uint:
		w.add(Alloc(8, false))
	case float32, int32, uint32:
		w.add(Alloc(4, false))
	case int16, uint16:
		w.add(Alloc(2, false))
	case map[string]any:
		if x == nil {
			return
		}
		w.add(mapBytes(len(x), 16, 16, true))
		for k, e := range x {
			if w.full() {
				return
			}
			w.add(Alloc(uintptr(len(k)), false))
			w.anyValue(e, depth+1)
		}
	case []any:
		w.add(Alloc(24, true)) // the slice's box
		if x == nil {
			return
		}
		w.add(Alloc(uintptr(cap(x))*16, true))
		for _, e := range x {
			if w.full() {
				return
			}
			w.anyValue(e, depth+1)
		}
	default:
		w.iface(reflect.ValueOf(x), depth)
	}
}

// Swiss tables (internal/runtime/maps): a map is a header; up to 8
// entries live in one group of 8 slots; more in tables of up to 1024
// slots, found through a directory. A group is a control word and 8 slots
// of a key and a value each; keys and values over 128 bytes are stored
// apart, their slots holding pointers.
const (
	mapHeader     = 48 // maps.Map
	tableHeader   = 32 // maps.table
	groupSlots    = 8
	maxTableSlots = 1024
	maxInline     = 128
)

func (w *walker) mapValue(v reflect.Value, depth int) {
	t := v.Type()
	kt, et := t.Key(), t.Elem()
	ki, ei := infoOf(kt), infoOf(et)
	n := v.Len()
	ks, es := kt.Size(), et.Size()
	kIndirect, eIndirect := ks > maxInline, es > maxInline
	if kIndirect {
		w.add(int64(n) * Alloc(ks, ki.pointers))
		ks = 8
	}
	if eIndirect {
		w.add(int64(n) * Alloc(es, ei.pointers))
		es = 8
	}
	slot := align(align(ks, uintptr(kt.Align()))+es, uintptr(max(kt.Align(), et.Align())))
	w.add(mapBytes(n, slot, 0, ki.pointers || ei.pointers || kIndirect || eIndirect))
	if !ki.walk && !ei.walk {
		return
	}
	if w.keys == nil {
		w.keys = make(map[reflect.Type]reflect.Value)
		w.elems = make(map[reflect.Type]reflect.Value)
	}
	// The reusable values are taken out while the entries are walked, so
	// that a map nested in one of them, of the same type, makes its own.
	k, ok := w.keys[kt]
	if !ok {
		k = reflect.New(kt).Elem()
	}
	delete(w.keys, kt)
	e, ok := w.elems[et]
	if !ok {
		e = reflect.New(et).Elem()
	}
	delete(w.elems, et)
	if !v.CanInterface() {
		// Reached through an unexported field: reflect does not iterate
		// such a map into values of its own, so view it afresh.
		m := v.UnsafePointer()
		v = reflect.NewAt(t, unsafe.Pointer(&m)).Elem()
	}
	for it := v.MapRange(); it.Next() && !w.full(); {
		if ki.walk {
			k.SetIterKey(it)
			w.value(k, depth+1)
		}
		if ei.walk {
			e.SetIterValue(it)
			w.value(e, depth+1)
		}
	}
	k.SetZero()
	e.SetZero()
	w.keys[kt], w.elems[et] = k, e
}

// mapBytes returns the bytes of a map of n entries in slots of keySize
// plus elemSize bytes (a slot as laid out), besides what its keys and
// values reach.
func mapBytes(n int, keySize, elemSize uintptr, pointers bool) int64 {
	group := 8 + groupSlots*(keySize+elemSize)
	b := Alloc(mapHeader, true)
	switch {
	case n == 0:
		// A map made without a size hint allocates its group on the
		// first insert.
	case n <= groupSlots:
		b += Alloc(group, pointers)
	default:
		// Grown by inserts: the smallest power of two of slots at most
		// 7/8 full.
		slots := uintptr(groupSlots)
		for uintptr(n) > slots*7/8 {
			slots *= 2
		}
		tables := uintptr(1)
		if slots > maxTableSlots {
			tables = slots / maxTableSlots
			slots = maxTableSlots
			b += Alloc(tables*8, true) // the directory
		}
		b += int64(tables) * (Alloc(tableHeader, true) + Alloc(slots/groupSlots*group, pointers))
	}
	return b
}

func align(n, a uintptr) uintptr { return (n + a - 1) &^ (a - 1) }

// A typeInfo says what the walk needs to know of a type.
type typeInfo struct {
	pointers bool  // whether its memory holds pointers (the allocator's business)
	walk     bool  // whether a value of it may reach allocations of its own
	fields   []int // a struct's fields that may
}

var infos sync.Map // reflect.Type → *typeInfo

func infoOf(t reflect.Type) *typeInfo {
	if i, ok := infos.Load(t); ok {
		return i.(*typeInfo)
	}
	i := &typeInfo{}
	switch t.Kind() {
	case reflect.String, reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface:
		i.pointers, i.walk = true, true
	case reflect.Chan, reflect.Func, reflect.UnsafePointer:
		i.pointers = true
	case reflect.Array:
		if t.Len() > 0 {
			ei := infoOf(t.Elem())
			i.pointers, i.walk = ei.pointers, ei.walk
		}
	case reflect.Struct:
		for f := range t.NumField() {
			fi := infoOf(t.Field(f).Type)
			i.pointers = i.pointers || fi.pointers
			if fi.walk {
				i.fields = append(i.fields, f)
			}
		}
		i.walk = len(i.fields) > 0
	}
	actual, _ := infos.LoadOrStore(t, i)
	return actual.(*typeInfo)
}
