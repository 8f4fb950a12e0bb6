package packcache

// Tests of a Cache of a pointer type. They are in the package itself, not
// in packcache_test with the others, because each shape of T instantiates
// the whole Cache again in the compile of the package its tests are in:
// a pointer T there cost that compile another 85 MB, over the README's
// 1 GiB for the test command.

import (
	"context"
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
