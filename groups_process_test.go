package packcache_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/internal/redistest"
)

// Groups across two OS processes (issue 25): the test binary runs itself
// again as a child (mode "groups", see child in lease_test.go), whose
// caches take commands on stdin, one a line, and answer each with one
// line on stdout.

// childMaxLag is the near caches' MaxLag in TestGroupsTwoProcesses.
const childMaxLag = 500 * time.Millisecond

func groupsNear(near bool, opts ...packcache.Option) []packcache.Option {
	if !near {
		return opts
	}
	return append([]packcache.Option{packcache.WithLocalCache(packcache.LocalCache{MaxBytes: 16 << 20, TTL: time.Minute, MaxLag: childMaxLag})}, opts...)
}

// TestGroupsTwoProcesses: once InvalidateGroups returns, no Get or
// GetMany that starts afterwards in another OS process returns a value
// stored in the group before it (from a near cache: none that starts
// more than MaxLag after it), either way round; a load of the other
// process that began before it (its loader read the source before) stores
// nothing that either process serves afterwards. Single node and Cluster,
// near cache on and off.
func TestGroupsTwoProcesses(t *testing.T) {
	t.Parallel() // a set of the shared servers and a child process of its own; its bounds are from MaxLag, "whatever the machine's load"
	forEachTarget(t, func(t *testing.T, tg redistest.Target) {
		for _, near := range []bool{false, true} {
			t.Run(fmt.Sprintf("near=%v", near), func(t *testing.T) {
				ctx := ctxT(t)
				id := fmt.Sprintf("%s:%v:%d", tg.Name, near, time.Now().UnixNano())
				g, g2, g3, gs := "tp:"+id, "tp2:"+id, "tp3:"+id, "tps:"+id
				// Without a share window: a Get may share a read begun up to
				// one window before it (WithShareWindow), which this test is
				// not about.
				p := mustNew[string](t, tg.Client, groupsNear(near, packcache.WithShareWindow(packcache.Off))...)
				_, stdin, stdout := startChild(t, tg, "groups", strconv.FormatBool(near))
				ask := func(format string, args ...any) string {
					t.Helper()
					fmt.Fprintf(stdin, format+"\n", args...)
					return readLine(t, stdout)
				}
				if got := ask("hello"); got != "ready" {
					t.Fatalf("child: %q", got)
				}
				k1, k2, k3 := "tp:"+id+":1", "tp:"+id+":2", "tp:"+id+":outside"

				// The parent invalidates; the child reads.
				for _, k := range []string{k1, k2} {
					if err := p.Set(ctx, k, "old", packcache.InGroups(g)); err != nil {
						t.Fatal(err)
					}
				}
				if err := p.Set(ctx, k3, "stays", packcache.InGroups(g2, "tp-other:"+id)); err != nil {
					t.Fatal(err)
				}
				for _, k := range []string{k1, k2, k3} {
					if got := ask("get %s", k); !strings.HasPrefix(got, "val ") {
						t.Fatalf("child: get %s before: %q", k, got)
					}
					if near {
						if got := ask("nearwait %s", k); got != "ok" {
							t.Fatalf("child: nearwait %s: %q", k, got)
						}
					}
				}
				if err := p.InvalidateGroups(ctx, g); err != nil {
					t.Fatal(err)
				}
				returned := time.Now()
				for _, k := range []string{k1, k2} {
					if !near {
						if got := ask("get %s", k); got != "miss" {
							t.Errorf("child: get %s after the parent's InvalidateGroups: %q, want miss", k, got)
						}
						continue
					}
					// From the near cache, within MaxLag: a Get that begins
					// more than MaxLag after the invalidation returned never
					// serves the old value (near.go's bound), whatever the
					// machine's load; one that begins sooner may.
					if got := ask("getafter %d %s", returned.Add(childMaxLag).UnixNano(), k); got != "miss" {
						t.Errorf("child: get %s begun MaxLag after the parent's InvalidateGroups: %q, want miss", k, got)
					}
				}
				if got := ask("getmany %s,%s,%s", k1, k2, k3); got != "vals "+k3+"=stays" {
					t.Errorf("child: getmany after: %q, want only %s", got, k3)
				}

				// The child invalidates; the parent reads.
				k4 := "tp:" + id + ":4"
				if got := ask("set %s old %s", k4, g3); got != "ok" {
					t.Fatalf("child: set: %q", got)
				}
				if v, err := p.Get(ctx, k4); err != nil || v != "old" {
					t.Fatalf("parent: Get %s before: %q, %v", k4, v, err)
				}
				if near {
					waitNear(t, p, k4)
				}
				if got := ask("invalidate %s", g3); got != "ok" {
					t.Fatalf("child: invalidate: %q", got)
				}
				returned = time.Now() // after the child's answer: after it returned
				if near {
					waitUntil(returned.Add(childMaxLag))
				}
				if v, err := p.Get(ctx, k4); !errors.Is(err, packcache.ErrMiss) {
					t.Errorf("parent: Get %s after the child's InvalidateGroups: %q, %v; want ErrMiss", k4, v, err)
				}
				if got, err := p.GetMany(ctx, []string{k4, k3}); err != nil || len(got) != 1 || got[k3] != "stays" {
					t.Errorf("parent: GetMany after the child's InvalidateGroups: %v, %v", got, err)
				}
				rec := httptest.NewRecorder()
				p.Serve(rec, httptest.NewRequest("GET", "/"+k4, nil), k4)
				if rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "old") {
					t.Errorf("parent: Serve after the child's InvalidateGroups: %d %q", rec.Code, rec.Body.String())
				}

				// The child's load began before the parent's invalidation:
				// its loader has read the source, and names the group.
				ks := "tps:" + id
				if got := ask("slow %s %s", ks, gs); got != "loading" {
					t.Fatalf("child: slow: %q", got)
				}
				if err := p.InvalidateGroups(ctx, gs); err != nil {
					t.Fatal(err)
				}
				// The load raced the invalidation: it calls its loader again,
				// and its caller gets, and Redis keeps, the second value.
				if got := ask("release"); got != "got child-new" {
					t.Fatalf("child's slow Get: %q, want child-new", got)
				}
				if v, err := p.Get(ctx, ks); err == nil && v == "child-old" {
					t.Errorf("parent: Get served the value of the child's load begun before InvalidateGroups")
				}
				if v, err := p.GetOrLoad(ctx, ks, func(context.Context) (string, error) { return "parent-new", nil }); err != nil || v == "child-old" {
					t.Errorf("parent: GetOrLoad: %q, %v", v, err)
				}
				if got := ask("get %s", ks); got == "val child-old" {
					t.Errorf("child: get %s: %q", ks, got)
				}
				fmt.Fprintln(stdin, "quit")
			})
		}
	})
}

// waitUntil returns once the clock has passed at: a guarantee bounded in
// time (a near cache's MaxLag) is checked by a read begun after the bound,
// not by waiting for something to happen.
func waitUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		<-time.After(d)
	}
}

// groupsChild is the child of TestGroupsTwoProcesses: args[0] says
// whether its caches have a near cache. See the commands below.
func groupsChild(rdb redis.UniversalClient, args []string) error {
	near := args[0] == "true"
	ctx := context.Background()
	plain, err := packcache.New[string](rdb, groupsNear(near, packcache.WithShareWindow(packcache.Off), packcache.WithRedisTimeout(time.Minute))...)
	if err != nil {
		return err
	}
	defer plain.Close()
	release := make(chan struct{})
	var slowGroup string
	var slowCalls atomic.Int64
	loading, err := packcache.New[string](rdb, groupsNear(near, packcache.WithShareWindow(packcache.Off), packcache.WithRedisTimeout(time.Minute),
		packcache.WithLoader(packcache.LoaderFunc[string](func(ctx context.Context, key string) (string, error) {
			if err := packcache.StoreWith(ctx, key, packcache.InGroups(slowGroup)); err != nil {
				return "", err
			}
			if slowCalls.Add(1) > 1 {
				return "child-new", nil
			}
			fmt.Println("loading")
			<-release
			return "child-old", nil
		})))...)
	if err != nil {
		return err
	}
	defer loading.Close()
	// Met groups: its loads read the group sequence before the loader.
	if err := loading.InvalidateGroups(ctx, "tp-meet"); err != nil {
		return err
	}
	answer := func(v string, err error) {
		switch {
		case errors.Is(err, packcache.ErrMiss):
			fmt.Println("miss")
		case err != nil:
			fmt.Println("error: " + strings.ReplaceAll(err.Error(), "\n", " "))
		default:
			fmt.Println("val " + v)
		}
	}
	in := bufio.NewScanner(os.Stdin)
	slowDone := make(chan string, 1)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "hello":
			fmt.Println("ready")
		case "get": // get KEY
			answer(plain.Get(ctx, f[1]))
		case "getafter": // getafter UNIXNANO KEY: a Get begun after that time
			n, _ := strconv.ParseInt(f[1], 10, 64)
			waitUntil(time.Unix(0, n))
			answer(plain.Get(ctx, f[2]))
		case "getmany": // getmany K1,K2,...: the values found, in the order asked
			keys := strings.Split(f[1], ",")
			got, err := plain.GetMany(ctx, keys)
			if err != nil {
				answer("", err)
				continue
			}
			var out []string
			for _, k := range keys {
				if v, ok := got[k]; ok {
					out = append(out, k+"="+v)
				}
			}
			fmt.Println("vals " + strings.Join(out, ","))
		case "nearwait": // nearwait KEY: until the near cache answers
			ok := false
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !ok; {
				before := plain.Stats().NearHits
				if _, err := plain.Get(ctx, f[1]); err != nil {
					break
				}
				ok = plain.Stats().NearHits > before
			}
			if ok {
				fmt.Println("ok")
			} else {
				fmt.Println("error: the near cache never answered")
			}
		case "set": // set KEY VALUE GROUP
			if err := plain.Set(ctx, f[1], f[2], packcache.InGroups(f[3])); err != nil {
				answer("", err)
				continue
			}
			fmt.Println("ok")
		case "invalidate": // invalidate GROUP
			if err := plain.InvalidateGroups(ctx, f[1]); err != nil {
				answer("", err)
				continue
			}
			fmt.Println("ok")
		case "slow": // slow KEY GROUP: a read-through Get whose loader names GROUP and waits for release; says "loading"
			slowGroup = f[2]
			go func() {
				v, err := loading.Get(ctx, f[1])
				if err != nil {
					v = err.Error()
				}
				slowDone <- v
			}()
		case "release": // release: the slow loader returns; says "got VALUE" once its Get returned
			close(release)
			fmt.Println("got " + <-slowDone)
		case "quit":
			return nil
		default:
			return fmt.Errorf("unknown command %q", f[0])
		}
	}
	return in.Err()
}
