// Command basic round-trips a ~100 KB JSON document through packcache with
// each codec and shows what Redis ends up holding.
//
// README: shows a typed round trip of a ~100 KB order history with the default
// options (zstd), LZ4, Snappy and no compression, and a small value stored as
// plain JSON. Run: go run ./examples/basic (embedded miniredis), or
// REDIS_ADDR=localhost:6379 go run ./examples/basic (real Redis; only keys
// under "packcache-example:<pid>:" are used, and they are deleted at the end).
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"reflect"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// OrderHistory is the large document: a customer's orders.
type OrderHistory struct {
	CustomerID string  `json:"customer_id"`
	Name       string  `json:"name"`
	Email      string  `json:"email"`
	Orders     []Order `json:"orders"`
}

type Order struct {
	ID       string    `json:"id"`
	PlacedAt time.Time `json:"placed_at"`
	Status   string    `json:"status"`
	Items    []Item    `json:"items"`
	Total    int64     `json:"total_cents"`
	ShipTo   string    `json:"ship_to"`
}

type Item struct {
	SKU   string `json:"sku"`
	Name  string `json:"name"`
	Qty   int    `json:"qty"`
	Price int64  `json:"price_cents"`
}

// Profile is the small value (well under the 1 KB compression threshold).
type Profile struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Email string `json:"email"`
}

// newOrderHistory builds the same ~100 KB history every time.
func newOrderHistory() OrderHistory {
	r := rand.New(rand.NewPCG(42, 7))
	products := []string{"USB-C cable", "Mechanical keyboard", "27in monitor", "Desk lamp", "Notebook A5", "Coffee beans 1kg", "Noise-cancelling headphones", "Laptop stand", "HDMI adapter", "Ergonomic mouse"}
	statuses := []string{"delivered", "delivered", "delivered", "shipped", "cancelled", "returned"}
	streets := []string{"Main St", "Oak Avenue", "Rue de Rivoli", "Baker Street", "Königsallee"}
	h := OrderHistory{CustomerID: "cust-000123", Name: "Ada Lovelace", Email: "ada@example.com"}
	t := time.Date(2021, 1, 1, 9, 0, 0, 0, time.UTC)
	for i := range 360 {
		t = t.Add(time.Duration(r.IntN(72*3600)) * time.Second)
		o := Order{ID: fmt.Sprintf("ord-%06d", 100000+i), PlacedAt: t, Status: statuses[r.IntN(len(statuses))],
			ShipTo: fmt.Sprintf("%d %s, %05d", 1+r.IntN(200), streets[r.IntN(len(streets))], r.IntN(100000))}
		for range 1 + r.IntN(3) {
			p := r.IntN(len(products))
			it := Item{SKU: fmt.Sprintf("SKU-%04d", p*37), Name: products[p], Qty: 1 + r.IntN(4), Price: int64(199 + r.IntN(30000))}
			o.Items = append(o.Items, it)
			o.Total += int64(it.Qty) * it.Price
		}
		h.Orders = append(h.Orders, o)
	}
	return h
}

type config struct {
	RedisAddr string // empty: embedded miniredis
}

type row struct {
	Options, Codec string
	Plain, Stored  int
	Equal          bool
}

type report struct {
	Redis      string
	Rows       []row
	SmallRaw   string // the small value exactly as Redis holds it
	SmallEqual bool
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, config{RedisAddr: os.Getenv("REDIS_ADDR")}, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, cfg config, w io.Writer) (rep report, err error) {
	addr := cfg.RedisAddr
	rep.Redis = "REDIS_ADDR " + addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return rep, err
		}
		defer mr.Close()
		addr, rep.Redis = mr.Addr(), "embedded miniredis at "+mr.Addr()
	}
	fmt.Fprintf(w, "redis: %s\n\n", rep.Redis)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	// Only keys under our own prefix, deleted at the end: never flush a
	// Redis we did not start.
	prefix := fmt.Sprintf("packcache-example:%d:", os.Getpid())
	var keys []string
	defer func() {
		if len(keys) > 0 {
			rdb.Del(context.WithoutCancel(ctx), keys...)
		}
	}()

	doc := newOrderHistory()
	variants := []struct {
		name string
		opts []packcache.Option
	}{
		{"default (zstd)", nil},
		{"WithCodec(codec.LZ4)", []packcache.Option{packcache.WithCodec(codec.LZ4)}},
		{"WithCodec(codec.Snappy)", []packcache.Option{packcache.WithCodec(codec.Snappy)}},
		{"WithCodec(codec.None)", []packcache.Option{packcache.WithCodec(codec.None)}},
	}
	for i, v := range variants {
		c, err := packcache.New[OrderHistory](rdb, v.opts...)
		if err != nil {
			return rep, err
		}
		key := fmt.Sprintf("%sorders:%d", prefix, i)
		keys = append(keys, key)
		if err := c.Set(ctx, key, doc); err != nil {
			return rep, err
		}
		got, err := c.Get(ctx, key)
		if err != nil {
			return rep, err
		}
		raw, err := rdb.Get(ctx, key).Bytes()
		if err != nil {
			return rep, err
		}
		var plain int
		for _, cs := range c.Stats().Codecs { // one Set: one entry
			plain = int(cs.BytesIn)
		}
		rep.Rows = append(rep.Rows, row{v.name, storedCodec(raw), plain, len(raw), reflect.DeepEqual(got, doc)})
		c.Close()
	}

	const format = "%-24s %-14s %10s %9s %6s  %s\n"
	fmt.Fprintf(w, format, "options", "stored as", "plain JSON", "stored", "saved", "read back equal")
	for _, r := range rep.Rows {
		fmt.Fprintf(w, format, r.Options, r.Codec, fmt.Sprint(r.Plain, " B"), fmt.Sprint(r.Stored, " B"),
			fmt.Sprintf("%.1f%%", 100*(1-float64(r.Stored)/float64(r.Plain))), fmt.Sprint(r.Equal))
	}

	// A small value stays plain JSON, readable by redis-cli and by code
	// that knows nothing of packcache.
	pc, err := packcache.New[Profile](rdb)
	if err != nil {
		return rep, err
	}
	defer pc.Close()
	small := Profile{ID: "cust-000123", Name: "Ada Lovelace", Email: "ada@example.com"}
	key := prefix + "profile:123"
	keys = append(keys, key)
	if err := pc.Set(ctx, key, small); err != nil {
		return rep, err
	}
	got, err := pc.Get(ctx, key)
	if err != nil {
		return rep, err
	}
	if rep.SmallRaw, err = rdb.Get(ctx, key).Result(); err != nil {
		return rep, err
	}
	rep.SmallEqual = got == small
	shown := rep.SmallRaw
	if len(shown) > 80 {
		shown = shown[:80] + "..."
	}
	fmt.Fprintf(w, "\nsmall value (%d B, under the %d B threshold) stored as %s: %s\nread back equal: %v\n",
		len(rep.SmallRaw), (1024), storedCodec([]byte(rep.SmallRaw)), shown, rep.SmallEqual)
	return rep, nil
}

// storedCodec names the format of a stored value from its first byte.
func storedCodec(raw []byte) string {
	if len(raw) == 0 || !codec.IsHeader(raw[0]) {
		return "plain JSON"
	}
	if c, ok := codec.Lookup(raw[0]); ok {
		return fmt.Sprintf("%s (0x%02x)", c.Name(), raw[0])
	}
	return fmt.Sprintf("unknown (0x%02x)", raw[0])
}
