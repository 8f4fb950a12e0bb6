package httpenc

import (
	"net/http"
	"strconv"
	"strings"
)

// CheckMethod reports whether r's method is one a body is served for, GET
// or HEAD. If it is not, it answers r with 405 Method Not Allowed and
// Allow: GET, HEAD.
func CheckMethod(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	return false
}

// Write answers r, a GET or HEAD, with b, the body Pick chose for it; a
// nil b (r accepts no coding the value has) is answered 406 Not
// Acceptable.
//
// A 200 has Content-Type (contentType, unless w has one already),
// Content-Length, Content-Encoding for a coded body (an application's is
// removed for identity), b's strong ETag, and Accept-Encoding in Vary,
// joined to the application's own; the other headers set on w are kept. A
// HEAD gets the headers of GET and no body. If r's If-None-Match lists
// b's ETag (weak comparison) or is "*", the answer is 304 Not Modified
// with the ETag and Vary and without the metadata of a body it does not
// have (RFC 9110, section 15.4.5).
func Write(w http.ResponseWriter, r *http.Request, b *Body, contentType string) {
	if b == nil {
		http.Error(w, http.StatusText(http.StatusNotAcceptable), http.StatusNotAcceptable)
		return
	}
	h := w.Header()
	addVary(h)
	h["Etag"] = []string{b.etag}
	if etagMatch(r.Header["If-None-Match"], b.etag) {
		delete(h, "Content-Type")
		delete(h, "Content-Length")
		delete(h, "Content-Encoding")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = []string{contentType}
	}
	if b.coding != "" {
		h["Content-Encoding"] = []string{b.coding}
	} else {
		delete(h, "Content-Encoding")
	}
	h["Content-Length"] = []string{strconv.Itoa(len(b.b))}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(b.b) // a client gone is nothing to report
	}
}

// addVary adds Accept-Encoding to the response's Vary, unless it is
// there, or Vary is "*".
func addVary(h http.Header) {
	for _, v := range h["Vary"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "*" || strings.EqualFold(f, "Accept-Encoding") {
				return
			}
		}
	}
	h.Add("Vary", "Accept-Encoding")
}
