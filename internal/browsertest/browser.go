// Package browsertest drives headless Chromium from Go tests: a page of a
// test server runs a JavaScript expression (typically a fetch) and the test
// gets back the value it computed, while a Recorder on the server side keeps
// what the browser asked and what it was sent.
//
// A test starts one browser and evaluates as many pages as it likes:
//
//	b := browsertest.Start(t) // skips without Chromium, unless PACKCACHE_REQUIRE_BROWSER=1
//	mux := http.NewServeMux()
//	mux.Handle("GET /{$}", browsertest.Page)
//	mux.HandleFunc("GET /channel", serveChannel)
//	rec := browsertest.Record(mux)
//	srv := httptest.NewServer(rec) // or browsertest.NewTLSServer(t, rec)
//	defer srv.Close()
//	got, err := b.Fetch(ctx, srv.URL+"/", srv.URL+"/channel")
//	// got.Body is the text the page decoded, got.Header what it saw;
//	// e, _ := rec.Last("/channel") is what was asked (e.RequestHeader)
//	// and sent (e.Header, e.Body: the bytes before decoding).
//
// Each of b's evaluations has a browser context of its own, which costs a
// renderer process. A test that evaluates several pages can open a Tab,
// whose evaluations share one page and its renderer:
//
//	tab := b.Tab(t) // closed when the test ends
//	got, err := tab.Fetch(ctx, srv.URL+"/", srv.URL+"/channel")
//
// # How the browser is driven
//
// Chromium runs with --remote-debugging-pipe: it reads DevTools protocol
// commands from file descriptor 3 and answers on 4, NUL-separated JSON, so
// the package needs no websocket code, no port and no dependency. For each
// evaluation it opens a fresh browser context (an empty cache and cookie
// jar, so every fetch reaches the server) or takes the Tab's, navigates a
// page to the given URL, waits for that navigation's own load event
// (matched by its loader id, so neither the initial about:blank nor the
// page before can be mistaken for it), and runs the expression with
// Runtime.evaluate awaiting its promise. The result is the
// expression's own value or its exception, never a guess after a sleep:
// --dump-dom with --virtual-time-budget would need a page that writes its
// verdict into the DOM, would launch a browser per page, and would report a
// failed fetch as a DOM without the verdict.
//
// # Which origins Chromium offers zstd to
//
// Chromium 156 sends "Accept-Encoding: gzip, deflate, br, zstd" to https
// origins and to http origins it deems potentially trustworthy: 127.0.0.1
// (and all of 127.0.0.0/8), [::1], localhost and names under .localhost.
// To plain http of any other host name (tested as example.test mapped to
// 127.0.0.1 with MapHost) it sends "gzip, deflate". TestAcceptEncoding
// checks this for each origin. For https, the browser trusts the package's
// certificate (see Certificate) through --ignore-certificate-errors-spki-list,
// which keeps the origin secure; --ignore-certificate-errors does too.
//
// # Processes
//
// Chromium and its children run in a process group of their own, with
// HOME and the XDG directories in a temporary directory beside the profile.
// Close (run by Start's cleanup) asks the browser to quit, kills the group
// and chrome_crashpad_handler (which leaves the group for a session of its
// own, and is known by the temporary directory in its command line), waits
// until none of them is alive, and removes the directory. On Linux the
// browser also gets SIGKILL if the test binary dies first.
package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv is the environment variable that, when set to "1", makes a
// missing browser a test failure instead of a skip. CI sets it.
const RequireEnv = "PACKCACHE_REQUIRE_BROWSER"

// BrowserEnv names an executable to use instead of searching PATH.
const BrowserEnv = "PACKCACHE_BROWSER"

// names are the executables Find looks for on PATH, in order: Debian's
// package, other distributions' name for it, and Google's build.
var names = []string{"chromium", "chromium-browser", "google-chrome"}

// Find returns the path of the browser to drive: $PACKCACHE_BROWSER if set,
// else the first of chromium, chromium-browser and google-chrome on PATH.
func Find() (string, error) {
	if p := os.Getenv(BrowserEnv); p != "" {
		return exec.LookPath(p)
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("none of %v on PATH (install Debian's chromium: bash .ci/install-browser)", names)
}

// Require returns the browser's path. Without one it skips the test, or
// fails it when PACKCACHE_REQUIRE_BROWSER=1.
func Require(tb testing.TB) string {
	tb.Helper()
	if !supported {
		skipOrFail(tb, "browsertest needs a Unix system (Chromium is driven over file descriptors 3 and 4)")
	}
	p, err := Find()
	if err != nil {
		skipOrFail(tb, "no browser: "+err.Error())
	}
	return p
}

func skipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("%s (%s=1)", msg, RequireEnv)
	}
	tb.Skipf("%s; set %s=1 to fail instead", msg, RequireEnv)
}

// An Option changes how Start and Launch run the browser.
type Option func(*config)

type config struct {
	hosts []string
	flags []string
}

// MapHost makes the browser resolve name to 127.0.0.1, so that a test can
// reach its server under a host name that is not a loopback name.
func MapHost(name string) Option {
	return func(c *config) { c.hosts = append(c.hosts, name) }
}

// Flag adds a command-line flag, such as "--ignore-certificate-errors".
func Flag(flag string) Option {
	return func(c *config) { c.flags = append(c.flags, flag) }
}

// launchTimeout bounds Start's launch: a cold Chromium starts in about a
// second here, a loaded CI machine may take several.
const launchTimeout = 60 * time.Second

// Start launches the browser for the test (see Require for when it skips)
// and closes it when the test and its subtests end. It fails the test if
// the browser does not start.
func Start(tb testing.TB, opts ...Option) *Browser {
	tb.Helper()
	path := Require(tb)
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	b, err := Launch(ctx, path, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Error(err)
		}
	})
	return b
}

// Browser is a running headless Chromium. Its methods may be called from
// several goroutines; evaluations run one at a time.
type Browser struct {
	cmd     *exec.Cmd
	dir     string // holds the profile and stderr.log; removed by Close
	version string
	exited  chan struct{} // closed when cmd.Wait returns

	mu   sync.Mutex // serializes use of conn
	conn *conn
	down bool // set by shutdown, under mu: conn is closed

	closeOnce sync.Once
	closeErr  error
}

// Launch starts the browser at path (see Find). ctx bounds the start only:
// the browser runs until Close.
func Launch(ctx context.Context, path string, opts ...Option) (_ *Browser, err error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	cert, err := Certificate()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "browsertest-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	defer stderr.Close() // the child holds its own copy
	args := []string{
		"--headless",
		// As root in a container Chromium's sandbox cannot start.
		"--no-sandbox",
		// There is no GPU; without it Chromium still probes for one.
		"--disable-gpu",
		// /dev/shm is 64 MB in many containers; renderers crash past it.
		"--disable-dev-shm-usage",
		"--user-data-dir=" + filepath.Join(dir, "profile"),
		"--remote-debugging-pipe",
		// Trusts the package's certificate and keeps the origin secure;
		// Chromium honours it only together with --user-data-dir.
		"--ignore-certificate-errors-spki-list=" + SPKIHash(cert.Leaf),
		// Resolve nothing but the test's own names: no background request
		// of the browser's can leave the machine, or wait on a DNS timeout.
		// (Its one other socket to the outside is the IPv6 reachability
		// probe, a UDP connect that sends nothing.)
		hostRules(c.hosts),
		"--disable-background-networking",
		"--disable-component-update",
		"--disable-sync",
		"--disable-extensions",
		"--no-first-run",
		"--no-default-browser-check",
		"--password-store=basic",
		"--mute-audio",
	}
	// Headless Chromium still makes a browser window for each browser
	// context, and preloads the window's omnibox popup: a WebUI page
	// with a renderer of its own, which took 1.5 CPU-seconds at launch
	// and as much again for each browser context (Chromium 156 here),
	// for a popup nothing shows. A Flag of --disable-features adds to
	// the list, which Chromium would otherwise replace.
	disabled := []string{"WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup"}
	for _, f := range c.flags {
		if features, ok := strings.CutPrefix(f, "--disable-features="); ok {
			disabled = append(disabled, features)
			continue
		}
		args = append(args, f)
	}
	args = append(args, "--disable-features="+strings.Join(disabled, ","), "about:blank")

	// Chromium reads commands from fd 3 (the child's end of toChrome)
	// and writes answers to fd 4 (the child's end of fromChrome).
	toChromeR, toChromeW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	fromChromeR, fromChromeW, err := os.Pipe()
	if err != nil {
		toChromeR.Close()
		toChromeW.Close()
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	cmd.ExtraFiles = []*os.File{toChromeR, fromChromeW}
	cmd.SysProcAttr = sysProcAttr()
	// What Chromium keeps outside its profile (dconf, the crash
	// database) goes to the temporary directory too, where Close finds
	// the crash handler by it.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_CACHE_HOME="+dir)
	err = cmd.Start()
	toChromeR.Close()
	fromChromeW.Close()
	if err != nil {
		toChromeW.Close()
		fromChromeR.Close()
		return nil, err
	}
	b := &Browser{
		cmd:    cmd,
		dir:    dir,
		exited: make(chan struct{}),
		conn:   newConn(toChromeW, fromChromeR),
	}
	go func() {
		cmd.Wait()
		close(b.exited)
	}()

	var v struct {
		Product string `json:"product"`
	}
	if err := b.conn.call(ctx, "", "Browser.getVersion", nil, &v); err != nil {
		err = b.fail(fmt.Errorf("browsertest: start %s: %w", path, err))
		b.shutdown(false)
		return nil, err
	}
	b.version = v.Product
	return b, nil
}

// hostRules is the --host-resolver-rules flag: the given names resolve to
// 127.0.0.1, localhost and *.localhost as Chromium resolves them itself
// (to loopback), and every other name fails at once.
func hostRules(hosts []string) string {
	var buf bytes.Buffer
	buf.WriteString("--host-resolver-rules=")
	for _, h := range hosts {
		fmt.Fprintf(&buf, "MAP %s 127.0.0.1, ", h)
	}
	buf.WriteString("MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE *.localhost, EXCLUDE 127.*, EXCLUDE ::1")
	return buf.String()
}

// Version is the browser's product string, e.g. "HeadlessChrome/156.0.8078.114".
func (b *Browser) Version() string { return b.version }

// Eval navigates a fresh page to pageURL, waits for it to load, evaluates
// the JavaScript expression in it and stores the JSON of its value in out
// (which may be nil to drop it). An expression that evaluates to a promise
// is awaited. A thrown exception or rejected promise is an error carrying
// its message, as is a value of undefined when out is not nil.
//
// pageURL must answer with a page (an HTML document, even an empty one).
// A navigation that fails (no connection, a certificate not trusted, an
// error status with an empty body) or ends at another origin is an error,
// and the expression does not run.
//
// Each call has its own browser context: nothing is cached or kept from one
// call to the next. That costs a browser context and a renderer process per
// call, 0.75 CPU-seconds here; a Tab keeps them for its calls. ctx bounds
// the whole call; a call cut short by ctx leaves the browser unusable
// (later calls fail), so give it room.
func (b *Browser) Eval(ctx context.Context, pageURL, expression string, out any) error {
	wrapped, err := wrap(pageURL, expression)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	contextID, session, err := b.conn.openTab(ctx)
	if err != nil {
		return b.fail(fmt.Errorf("browsertest: eval on %s: %w", pageURL, err))
	}
	// Disposing of the context closes its page, and with it the
	// renderer's work: nothing of this call runs on into the next.
	defer b.conn.disposeContext(ctx, contextID)
	return b.evalIn(ctx, session, pageURL, wrapped, out)
}

// wrap makes expression an async function's that first checks the page
// is at pageURL's origin: the check catches Chromium's error page
// (chrome-error://) before the expression runs in it and fails in a
// confusing way.
func wrap(pageURL, expression string) (string, error) {
	u, err := url.Parse(pageURL)
	if err != nil {
		return "", err
	}
	origin, err := json.Marshal(originOf(u))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`(async () => {
	if (location.origin !== %s) {
		throw new Error("the page is " + location.href + ", not the one asked for (redirected?)");
	}
	return await (%s
	);
})()`, origin, expression), nil
}

// evalIn navigates the page of session to pageURL and evaluates wrapped
// there (see Eval). b.mu must be held.
func (b *Browser) evalIn(ctx context.Context, session, pageURL, wrapped string, out any) error {
	raw, err := b.conn.eval(ctx, session, pageURL, wrapped)
	if err != nil {
		return b.fail(fmt.Errorf("browsertest: eval on %s: %w", pageURL, err))
	}
	if out == nil {
		return nil
	}
	if raw == nil {
		return fmt.Errorf("browsertest: eval on %s: the expression's value is undefined", pageURL)
	}
	return json.Unmarshal(raw, out)
}

// originOf is u's origin as a page's location.origin spells it.
func originOf(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == "" || scheme == "http" && port == "80" || scheme == "https" && port == "443" {
		return scheme + "://" + host
	}
	return scheme + "://" + host + ":" + port
}

// Page serves an empty HTML page: something for Eval and Fetch to load at
// the origin of the URLs a test fetches.
var Page http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	io.WriteString(w, "<!doctype html><title>browsertest</title>")
})

// Response is what a page's fetch saw.
type Response struct {
	Status int `json:"status"`
	// Header holds the response headers visible to the page, with
	// lower-case names; repeated fields are joined by ", ".
	Header map[string]string `json:"header"`
	// Body is the body as the page's Response.text() decoded it: after
	// the content coding is undone, read as UTF-8.
	Body string `json:"body"`
}

// Fetch evaluates fetch(fetchURL) on the page at pageURL (see Eval) with
// the cache bypassed, and returns the response the page saw.
func (b *Browser) Fetch(ctx context.Context, pageURL, fetchURL string) (Response, error) {
	return fetch(ctx, b.Eval, pageURL, fetchURL)
}

// fetch is Fetch with the Eval of a Browser or a Tab.
func fetch(ctx context.Context, eval func(ctx context.Context, pageURL, expression string, out any) error, pageURL, fetchURL string) (Response, error) {
	target, err := json.Marshal(fetchURL)
	if err != nil {
		return Response{}, err
	}
	var r Response
	err = eval(ctx, pageURL, fmt.Sprintf(`fetch(%s, {cache: "no-store"}).then(async r => ({
	status: r.status,
	header: Object.fromEntries(r.headers),
	body: await r.text(),
}))`, target), &r)
	return r, err
}

// fail adds to err the end of what the browser printed, which says why it
// died when it did.
func (b *Browser) fail(err error) error {
	log, _ := os.ReadFile(filepath.Join(b.dir, "stderr.log"))
	const keep = 2000
	if len(log) > keep {
		log = log[len(log)-keep:]
	}
	if len(log) == 0 {
		return err
	}
	return fmt.Errorf("%w\nchromium's output ends:\n%s", err, log)
}

// closeTimeout bounds each step of Close: Chromium's own exit after
// Browser.close, then the exit of its process group after SIGKILL.
const closeTimeout = 10 * time.Second

// Close ends the browser and every process it started, and removes its
// temporary profile. It returns an error if a process of the browser's
// group is still alive after SIGKILL. Calling it again returns the same.
func (b *Browser) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.shutdown(true) })
	return b.closeErr
}

func (b *Browser) shutdown(graceful bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A broken connection (a call cut short) cannot carry Browser.close.
	if graceful && b.conn.err == nil {
		// Browser.close lets Chromium end its children itself; the
		// answer may not come before the pipe closes, so its error is
		// of no interest.
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		b.conn.call(ctx, "", "Browser.close", nil, nil)
		cancel()
		select {
		case <-b.exited:
		case <-time.After(closeTimeout):
		}
	}
	// Whatever is left of the group: the browser if it did not quit,
	// children that outlived it.
	err := killGroup(b.cmd.Process)
	<-b.exited
	if err == nil {
		err = endAll(b.cmd.Process.Pid, b.dir, closeTimeout)
	}
	b.conn.close()
	b.down = true
	return errors.Join(err, os.RemoveAll(b.dir))
}
