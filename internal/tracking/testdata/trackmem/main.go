// Command trackmem measures the memory of Redis's tracking table (OPTIN): n keys read after
// CLIENT CACHING yes by each of r reading connections in turn, used_memory
// before and after (docs/near-cache.md). Usage: trackmem ADDR N R
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

func info(ctx context.Context, c *redis.Client, f string) int64 {
	s, _ := c.Info(ctx).Result()
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, f+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return -1
}

func main() {
	ctx := context.Background()
	addr := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	readers, _ := strconv.Atoi(os.Args[3])
	admin := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2})
	p := admin.Pipeline()
	for i := range n {
		p.Set(ctx, fmt.Sprintf("doc:%08d", i), "v", 0)
		if i%1000 == 999 {
			p.Exec(ctx)
		}
	}
	p.Exec(ctx)
	sub := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, PoolSize: 1, ClientName: "trksub"})
	ps := sub.Subscribe(ctx, "__redis__:invalidate")
	ps.Receive(ctx)
	go func() {
		for range ps.Channel() {
		}
	}()
	subID := int64(-1)
	list, _ := admin.ClientList(ctx).Result()
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, "name=trksub ") {
			id, _, _ := strings.Cut(strings.TrimPrefix(l, "id="), " ")
			subID, _ = strconv.ParseInt(id, 10, 64)
		}
	}
	before := info(ctx, admin, "used_memory")
	for r := range readers {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, PoolSize: 1})
		cn := c.Conn()
		if err := cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", subID, "OPTIN").Err(); err != nil {
			panic(err)
		}
		p := cn.Pipeline()
		for i := range n {
			p.Do(ctx, "CLIENT", "CACHING", "yes")
			p.Get(ctx, fmt.Sprintf("doc:%08d", i))
			if i%1000 == 999 {
				p.Exec(ctx)
			}
		}
		p.Exec(ctx)
		after := info(ctx, admin, "used_memory")
		fmt.Printf("readers=%d keys=%d tracking_total_keys=%d tracking_total_items=%d used_memory +%d bytes (%.1f bytes per item)\n",
			r+1, n, info(ctx, admin, "tracking_total_keys"), info(ctx, admin, "tracking_total_items"), after-before,
			float64(after-before)/float64(info(ctx, admin, "tracking_total_items")))
	}
}
