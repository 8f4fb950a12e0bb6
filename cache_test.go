package packcache

// Tests of the typed shell (cache.go): what kind tells the core of T, and
// a Cache of a pointer type.

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/packcache/packcache/internal/redistest"
)

// TestLoaderNilPointer: for a Cache of a pointer type, a loader's nil
// pointer without an error is refused with ErrNilValue and not stored.
func TestLoaderNilPointer(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Universal(t)
	ctx := t.Context()
	type doc struct{ ID string }
	c, err := New[*doc](rdb, WithLoader(LoaderFunc[*doc](func(ctx context.Context, key string) (*doc, error) {
		return nil, nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, "nilptr"); !errors.Is(err, ErrNilValue) {
		t.Fatalf("Get: %v, want ErrNilValue", err)
	}
	if _, err := c.GetOrLoadMany(ctx, []string{"nilptr2"}, func(context.Context, []string) (map[string]*doc, error) {
		return map[string]*doc{"nilptr2": nil}, nil
	}); !errors.Is(err, ErrNilValue) {
		t.Fatalf("GetOrLoadMany: %v, want ErrNilValue", err)
	}
	if n := rdb.Exists(ctx, "nilptr", "nilptr2").Val(); n != 0 {
		t.Fatal("a nil pointer was stored")
	}
}

// TestKind: the core's view of T. Raw types are stored as they are and
// hand back the bytes they hold; a pointer T's nil is told apart; a value
// from the core is a *T, and none is T's zero value.
func TestKind(t *testing.T) {
	t.Parallel()
	raw := kindOf[json.RawMessage]()
	if !raw.raw || raw.isNil != nil {
		t.Fatalf("json.RawMessage: raw %v, isNil set %v", raw.raw, raw.isNil != nil)
	}
	v := raw.fromBytes([]byte(`{"a":1}`))
	if got := valueOf[json.RawMessage](v); string(got) != `{"a":1}` || string(raw.bytes(v)) != `{"a":1}` {
		t.Fatalf("json.RawMessage round trip: %s / %s", got, raw.bytes(v))
	}
	if b := raw.bytes(nil); b != nil {
		t.Fatalf("bytes of no value: %q", b)
	}
	if k := kindOf[[]byte](); !k.raw {
		t.Fatal("[]byte is not raw")
	}
	type doc struct{ ID string }
	if k := kindOf[doc](); k.raw || k.isNil != nil {
		t.Fatal("a struct is raw, or has a nil")
	}
	ptr := kindOf[*doc]()
	if ptr.isNil == nil || !ptr.isNil(ptr.new()) || ptr.isNil(&[]*doc{{ID: "x"}}[0]) {
		t.Fatal("a pointer T's nil is not told apart")
	}
	if got := valueOf[doc](nil); got != (doc{}) {
		t.Fatalf("no value: %+v, want the zero value", got)
	}
	if got := valuesOf[int](map[string]any{"a": new(int), "b": nil}); len(got) != 2 || got["a"] != 0 || got["b"] != 0 {
		t.Fatalf("valuesOf: %v", got)
	}
	ld, ok := kindOf[string]().loader(LoaderFunc[string](func(ctx context.Context, key string) (string, error) { return "v:" + key, nil }))
	if !ok {
		t.Fatal("a Loader[string] is not a loader of Cache[string]")
	}
	if v, err := ld(context.Background(), "k"); err != nil || *v.(*string) != "v:k" {
		t.Fatalf("loader: %v, %v", v, err)
	}
	if _, ok := kindOf[int]().loader(LoaderFunc[string](nil)); ok {
		t.Fatal("a Loader[string] was taken for a Cache[int]")
	}
}
