// Command walks makes the four calls whose paths docs/walks.md lists, one
// after the other, against a redis-server of its own: a miss (GetOrLoad
// of a key Redis does not hold), a near hit (Get of a key the near cache
// holds), a Serve of a near hit whose gzip body is made already, and a
// Delete that fails with ErrPending while the server is stopped
// (SIGSTOP). Before and after each call it calls mark, which does
// nothing: a tracer that stops at every function of the module sees,
// between two marks, the functions the call ran through, in order.
//
//	cd bench && go build -gcflags='all=-N -l' -o /tmp/walks ./walks
//	dlv trace --exec /tmp/walks 'github.com/packcache/packcache|main\.mark' 2>/tmp/walks.trace
//	go run ./walks -count /tmp/walks.trace
//
// With -check as well, it fails unless the miss runs through at most five
// files of the root package with at most twelve changes of file among
// them (issue 23's bound; CI checks it), and unless every call was seen.
// The build turns off inlining, so that one-line helpers are seen, as
// docs/walks.md's method counts them. With -count it reads such a trace
// and prints each call's functions with their files, and the hops, files,
// changes of file and goroutines, both over every file of the repository
// and over the root package alone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
)

// Doc is the value cached: a small struct, whose JSON is below the
// compression threshold, as the walks assume.
type Doc struct {
	ID    int    `json:"id"`
	Title string `json:"title"`
}

// mark is where a call begins and ends, for the tracer.
//
//go:noinline
func mark(name string) { _ = name }

func main() {
	count := flag.String("count", "", "read a dlv trace from this file and print the walks")
	check := flag.Bool("check", false, "with -count: fail unless the miss runs through at most 5 root files with at most 12 changes of file among them (issue 23)")
	flag.Parse()
	if *count != "" {
		if err := countTrace(*count, *check); err != nil {
			fmt.Fprintln(os.Stderr, "walks:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "walks:", err)
		os.Exit(1)
	}
}

func run() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	srv := exec.Command("redis-server", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no")
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGCONT)
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	for i := 0; rdb.Ping(context.Background()).Err() != nil; i++ {
		if i == 500 {
			return errors.New("redis-server did not answer")
		}
		time.Sleep(10 * time.Millisecond) // waiting for a process to listen, not synchronising tests
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// 1. A miss: the default policy, no near cache. The budget is long,
	// since a tracer slows every call down: the keeper of the load's
	// lease does not fire, as it does not when a loader returns within a
	// budget.
	plain, err := packcache.New[Doc](rdb, packcache.WithRedisTimeout(time.Minute))
	if err != nil {
		return err
	}
	defer plain.Close()
	mark("miss")
	_, err = plain.GetOrLoad(ctx, "doc:1", func(context.Context) (Doc, error) { return Doc{ID: 1, Title: "one"}, nil })
	mark("end")
	if err != nil {
		return err
	}

	// 2. A near hit, and 3. a Serve of one.
	near, err := packcache.New[Doc](rdb, packcache.WithRedisTimeout(time.Minute), packcache.WithLocalCache(packcache.LocalCache{}))
	if err != nil {
		return err
	}
	defer near.Close()
	if err := near.Set(ctx, "doc:2", Doc{ID: 2, Title: "two"}); err != nil {
		return err
	}
	// Serve compresses a body of 1 KiB or more.
	if err := near.Set(ctx, "doc:4", Doc{ID: 4, Title: strings.Repeat("four ", 400)}); err != nil {
		return err
	}
	for !near.Stats().NearServing {
		time.Sleep(time.Millisecond) // the tracking connection subscribing
	}
	serve := func() (string, error) {
		r := httptest.NewRequest(http.MethodGet, "/doc/4", nil)
		r.Header.Set("Accept-Encoding", "gzip")
		w := httptest.NewRecorder()
		near.Serve(w, r, "doc:4")
		if w.Code != http.StatusOK {
			return "", fmt.Errorf("serve: status %d", w.Code)
		}
		return w.Header().Get("Content-Encoding"), nil
	}
	for range 3 { // into the near cache, edged, its gzip body made
		if _, err := near.Get(ctx, "doc:2"); err != nil {
			return err
		}
		if _, err := serve(); err != nil {
			return err
		}
	}
	mark("nearhit")
	_, err = near.Get(ctx, "doc:2")
	mark("end")
	if err != nil {
		return err
	}
	if near.Stats().NearHits == 0 {
		return errors.New("the Get was not a near hit")
	}
	mark("serve")
	coding, err := serve()
	mark("end")
	if err != nil {
		return err
	}
	if coding != "gzip" {
		return fmt.Errorf("serve: coding %q", coding)
	}

	// 4. A failed Delete: the server stopped, a pooled connection, a
	// budget that runs out.
	short, err := packcache.New[Doc](rdb, packcache.WithRedisTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer short.Close()
	if err := short.Set(ctx, "doc:3", Doc{ID: 3}); err != nil {
		return err
	}
	if err := srv.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	mark("delete")
	err = short.Delete(ctx, "doc:3")
	mark("end")
	if !errors.Is(err, packcache.ErrPending) {
		return fmt.Errorf("delete: %v, not ErrPending", err)
	}
	return srv.Process.Signal(syscall.SIGCONT)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
