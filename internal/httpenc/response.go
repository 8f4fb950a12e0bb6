package httpenc

import (
	"net/http"
	"strconv"
	"strings"
	"time"
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
// HEAD gets the headers of GET and no body.
//
// r's preconditions are evaluated against b's ETag, and against the
// Last-Modified the application set on w if any, as net/http's
// ServeContent evaluates them (RFC 9110, section 13.2.2): an If-Match
// that lists neither b's ETag (strong comparison) nor "*", or, without
// If-Match, an If-Unmodified-Since before Last-Modified, is 412
// Precondition Failed; then an If-None-Match that lists b's ETag (weak
// comparison) or is "*", or, without If-None-Match, an If-Modified-Since
// not before Last-Modified, is 304 Not Modified. Without Last-Modified the
// dates are ignored, as the RFC asks (section 13.1.3 and 13.1.4). A 304
// or 412 has the ETag and Vary and none of the metadata of a body it does
// not have (section 15.4.5).
//
// It returns the status written and the bytes of body written (a 200's
// body, none for HEAD; 0 for the others).
func Write(w http.ResponseWriter, r *http.Request, b *Body, contentType string) (status, n int) {
	if b == nil {
		http.Error(w, http.StatusText(http.StatusNotAcceptable), http.StatusNotAcceptable)
		return http.StatusNotAcceptable, 0
	}
	h := w.Header()
	addVary(h, "Accept-Encoding")
	h["Etag"] = []string{b.etag}
	if status := preconditions(r, h, b.etag); status != 0 {
		delete(h, "Content-Type")
		delete(h, "Content-Length")
		delete(h, "Content-Encoding")
		if status == http.StatusNotModified {
			delete(h, "Last-Modified") // the ETag guides caches (RFC 9110, section 15.4.5)
		}
		w.WriteHeader(status)
		return status, 0
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
		n, _ = w.Write(b.b) // a client gone is nothing to report
	}
	return http.StatusOK, n
}

// preconditions returns the status r's preconditions call for, 412 or
// 304, or 0 for none: the body is sent. tag is the body's ETag, h the
// response's headers (for Last-Modified). See Write.
func preconditions(r *http.Request, h http.Header, tag string) int {
	modified := lastModified(h)
	if im := fieldValues(r, "If-Match"); im != nil {
		if !etagMatch(im, tag, true) {
			return http.StatusPreconditionFailed
		}
	} else if t, ok := headerTime(r, "If-Unmodified-Since"); ok && !modified.IsZero() && modified.After(t) {
		return http.StatusPreconditionFailed
	}
	if inm := fieldValues(r, "If-None-Match"); inm != nil {
		if etagMatch(inm, tag, false) {
			return http.StatusNotModified
		}
	} else if t, ok := headerTime(r, "If-Modified-Since"); ok && !modified.IsZero() && !modified.After(t) {
		return http.StatusNotModified
	}
	return 0
}

// lastModified is the Last-Modified set on h, to the second, or the zero
// time if there is none or it does not parse.
func lastModified(h http.Header) time.Time {
	v := h["Last-Modified"]
	if len(v) == 0 {
		return time.Time{}
	}
	t, err := http.ParseTime(v[0])
	if err != nil || t.Equal(time.Unix(0, 0)) {
		return time.Time{} // as ServeContent, which takes the epoch for none
	}
	return t.Truncate(time.Second)
}

// fieldValues returns the values of r's header name, or nil if it has
// none but empty ones: an empty field is no precondition.
func fieldValues(r *http.Request, name string) []string {
	v := r.Header[name]
	for _, s := range v {
		if strings.TrimSpace(s) != "" {
			return v
		}
	}
	return nil
}

// headerTime is the date of r's header name, if it has one that parses.
func headerTime(r *http.Request, name string) (time.Time, bool) {
	v := r.Header.Get(name)
	if v == "" {
		return time.Time{}, false
	}
	t, err := http.ParseTime(v)
	return t, err == nil
}

// addVary adds field to the response's Vary, unless it is there, or Vary
// is "*".
func addVary(h http.Header, field string) {
	for _, v := range h["Vary"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "*" || strings.EqualFold(f, field) {
				return
			}
		}
	}
	h.Add("Vary", field)
}
