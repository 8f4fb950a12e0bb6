package httpbench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWritten: a response's bytes, status line and headers included, are
// counted once.
func TestWritten(t *testing.T) {
	body := strings.Repeat("x", 10000)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	l := Wrap(srv.Listener)
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The client can hold the last bytes before the server's Write has
	// returned and counted them: Close waits for the server's side.
	srv.Close()
	if n := l.Written(); string(b) != body || n <= int64(len(body)) || n > int64(len(body))+500 {
		t.Errorf("%d bytes counted for a body of %d", n, len(body))
	}
}
