package browsertest

import (
	"net/http"
	"slices"
	"sync"
)

// Exchange is one request a Recorder saw and the response its handler
// wrote.
type Exchange struct {
	Method        string
	Host          string // the request's Host: the name the browser used
	Path          string // the request's URL path
	Proto         string // "HTTP/1.1", "HTTP/2.0"
	RequestHeader http.Header

	// Status is the status the handler wrote (200 if it wrote only a
	// body, 0 if nothing yet).
	Status int
	// Header is the response header as the handler had set it when it
	// wrote the status. net/http may still add Date, and Content-Length
	// or Content-Type where the handler set none.
	Header http.Header
	// Body is every byte of body the connection accepted from the handler,
	// before net/http's own framing (chunks, HTTP/2 frames): with a
	// Content-Encoding, the encoded bytes. It is empty for HEAD.
	Body []byte
}

// Recorder is an http.Handler that passes requests to another and keeps
// each exchange. Each write is recorded before it is passed on, so once a
// client has a response's last byte, Exchanges holds all of it.
type Recorder struct {
	h  http.Handler
	mu sync.Mutex
	ex []*Exchange
}

// Record returns a Recorder in front of h.
func Record(h http.Handler) *Recorder { return &Recorder{h: h} }

// ServeHTTP records the exchange while h serves it.
func (rec *Recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e := &Exchange{
		Method:        r.Method,
		Host:          r.Host,
		Path:          r.URL.Path,
		Proto:         r.Proto,
		RequestHeader: r.Header.Clone(),
	}
	rec.mu.Lock()
	rec.ex = append(rec.ex, e)
	rec.mu.Unlock()
	rec.h.ServeHTTP(&recordingWriter{ResponseWriter: w, rec: rec, e: e, head: r.Method == http.MethodHead}, r)
}

// Exchanges returns copies of the exchanges so far, in the order their
// requests arrived. One still being served holds what was written so far.
func (rec *Recorder) Exchanges() []Exchange {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]Exchange, len(rec.ex))
	for i, e := range rec.ex {
		out[i] = *e
		out[i].RequestHeader = e.RequestHeader.Clone()
		out[i].Header = e.Header.Clone()
		out[i].Body = slices.Clone(e.Body)
	}
	return out
}

// Last returns the latest exchange for path, and false if there is none.
func (rec *Recorder) Last(path string) (Exchange, bool) {
	ex := rec.Exchanges()
	for i := len(ex) - 1; i >= 0; i-- {
		if ex[i].Path == path {
			return ex[i], true
		}
	}
	return Exchange{}, false
}

type recordingWriter struct {
	http.ResponseWriter
	rec  *Recorder
	e    *Exchange
	head bool // net/http accepts a HEAD response's body and drops it
}

func (w *recordingWriter) WriteHeader(code int) {
	w.rec.mu.Lock()
	// 1xx responses are interim: the final status and header come later.
	if w.e.Status == 0 && code >= 200 {
		w.e.Status = code
		w.e.Header = w.Header().Clone()
	}
	w.rec.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
}

// implicitOK records what net/http sends when a handler writes a body or
// flushes before any status: 200 with the header as it stands. The caller
// holds rec.mu.
func (w *recordingWriter) implicitOK() {
	if w.e.Status == 0 {
		w.e.Status = http.StatusOK
		w.e.Header = w.Header().Clone()
	}
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.rec.mu.Lock()
	w.implicitOK()
	if w.head {
		w.rec.mu.Unlock()
		return w.ResponseWriter.Write(p)
	}
	// Record first: the client may have these bytes before Write returns.
	start := len(w.e.Body)
	w.e.Body = append(w.e.Body, p...)
	w.rec.mu.Unlock()
	n, err := w.ResponseWriter.Write(p)
	if n < len(p) {
		// A status without a body (204, 304), or a connection gone:
		// keep what was accepted.
		w.rec.mu.Lock()
		w.e.Body = w.e.Body[:start+n]
		w.rec.mu.Unlock()
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer
// (Flush, deadlines).
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush keeps a handler's w.(http.Flusher) working behind the Recorder.
func (w *recordingWriter) Flush() {
	w.rec.mu.Lock()
	w.implicitOK()
	w.rec.mu.Unlock()
	http.NewResponseController(w.ResponseWriter).Flush()
}
