package packcache_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/packcache/packcache"
)

// A handler that sends a channel to browsers as Redis stores it: zstd
// clients get the stored frame as it is, others gzip or plain JSON.
func ExampleCache_Serve() {
	rdb, done := exampleClient() // ContextTimeoutEnabled: true, as New requires
	defer done()
	channels, err := packcache.New[[]Order](rdb, packcache.WithTTL(time.Hour))
	if err != nil {
		panic(err)
	}
	defer channels.Close()
	history := make([]Order, 500)
	for i := range history {
		history[i] = Order{ID: i, Item: "notebook", Price: 2.5}
	}
	if err := channels.Set(context.Background(), "channel:physics", history); err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /channel/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "private, max-age=5") // kept by Serve
		channels.Serve(w, r, "channel:"+r.PathValue("name"))
	})

	for _, accept := range []string{"gzip, deflate, br, zstd", "gzip", ""} {
		req := httptest.NewRequest("GET", "/channel/physics", nil)
		if accept != "" {
			req.Header.Set("Accept-Encoding", accept)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%d %s %q, %s\n", rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Content-Encoding"), rec.Header().Get("Vary"))
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/channel/chemistry", nil))
	fmt.Printf("%d %q\n", rec.Code, rec.Body)
	// Output:
	// 200 application/json "zstd", Accept-Encoding
	// 200 application/json "gzip", Accept-Encoding
	// 200 application/json "", Accept-Encoding
	// 404 "Not Found\n"
}
