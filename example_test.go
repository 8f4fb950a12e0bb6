package packcache_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// The examples run on an embedded miniredis so that they need no set-up;
// the tests run against real redis-server processes.
func exampleClient() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	return rdb, func() { rdb.Close(); mr.Close() }
}

type Order struct {
	ID    int     `json:"id"`
	Item  string  `json:"item"`
	Price float64 `json:"price"`
}

func ExampleCache_Get() {
	rdb, done := exampleClient()
	defer done()
	ctx := context.Background()

	orders, err := packcache.New[[]Order](rdb, packcache.WithTTL(10*time.Minute))
	if err != nil {
		panic(err)
	}
	defer orders.Close()

	history := make([]Order, 200)
	for i := range history {
		history[i] = Order{ID: 1000 + i, Item: "notebook", Price: 2.5}
	}
	if err := orders.Set(ctx, "orders:42", history); err != nil {
		panic(err)
	}
	got, err := orders.Get(ctx, "orders:42")
	fmt.Println(len(got), got[0].Item, err)

	stored, _ := rdb.Get(ctx, "orders:42").Bytes()
	c, _ := codec.Lookup(stored[0])
	fmt.Println("stored with", c.Name())

	_, err = orders.Get(ctx, "orders:43")
	fmt.Println(errors.Is(err, packcache.ErrMiss))
	// Output:
	// 200 notebook <nil>
	// stored with zstd
	// true
}

func ExampleCache_GetOrLoad() {
	rdb, done := exampleClient()
	defer done()
	ctx := context.Background()

	orders, _ := packcache.New[[]Order](rdb)
	defer orders.Close()

	load := func(ctx context.Context) ([]Order, error) {
		fmt.Println("loading from the database")
		return []Order{{ID: 1, Item: "pen", Price: 1}}, nil
	}
	for range 2 {
		v, err := orders.GetOrLoad(ctx, "orders:7", load)
		fmt.Println(v[0].Item, err)
	}
	// Output:
	// loading from the database
	// pen <nil>
	// pen <nil>
}

func ExampleWithLoader() {
	rdb, done := exampleClient()
	defer done()
	ctx := context.Background()

	users, _ := packcache.New[string](rdb,
		packcache.WithPrefix("", packcache.Policy{NegativeTTL: time.Minute}),
		packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			if key == "user:0" {
				return "", packcache.ErrNotFound // remembered for a minute
			}
			return strings.ToUpper(key), nil
		})))
	defer users.Close()

	fmt.Println(users.Get(ctx, "user:ada"))
	_, err := users.Get(ctx, "user:0")
	fmt.Println(errors.Is(err, packcache.ErrNotFound))
	// Output:
	// USER:ADA <nil>
	// true
}

func ExampleWithPrefix() {
	rdb, done := exampleClient()
	defer done()
	ctx := context.Background()

	docs, _ := packcache.New[[]byte](rdb,
		packcache.WithPrefix("chat:", packcache.Policy{Codec: codec.LZ4, TTL: 5 * time.Minute}),
		packcache.WithPrefix("report:", packcache.Policy{Codec: codec.ZstdBetter, CompressAbove: 4096}),
	)
	defer docs.Close()

	doc := []byte(`[` + strings.Repeat(`{"text":"see you at the lecture"},`, 200) + `{}]`)
	for _, key := range []string{"chat:1", "report:1", "other:1"} {
		docs.Set(ctx, key, doc)
		stored, _ := rdb.Get(ctx, key).Bytes()
		c, _ := codec.Lookup(stored[0])
		fmt.Printf("%s: %s, under 2%% of %d bytes: %v\n", key, c.Name(), len(doc), len(stored)*50 < len(doc))
	}
	// Output:
	// chat:1: lz4, under 2% of 6804 bytes: true
	// report:1: zstd, under 2% of 6804 bytes: true
	// other:1: zstd, under 2% of 6804 bytes: true
}
