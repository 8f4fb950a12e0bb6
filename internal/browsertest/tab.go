package browsertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A Tab is a page of the browser in a browser context of its own, for
// evaluations that may share what that context keeps: each of its Evals
// navigates the same page, so the cache, cookies and open connections of
// one are there for the next (Fetch bypasses the cache all the same).
// What it saves is the browser context and, for a page of the site the tab
// showed last, the renderer process: measured here (Chromium 156, 2
// cores), a Browser.Eval of an empty page costs 0.75 CPU-seconds, a Tab's
// 0.09, or 0.33 on another site.
//
// A Tab's methods may be called from several goroutines; they take turns
// with every other evaluation of its browser.
type Tab struct {
	b         *Browser
	contextID string
	session   string
	closed    bool // under b.mu
}

// NewTab opens a tab at about:blank in a fresh browser context (an empty
// cache and cookie jar). ctx bounds the opening; one cut short leaves the
// browser unusable, as an Eval does.
func (b *Browser) NewTab(ctx context.Context) (*Tab, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return nil, errors.New("browsertest: open a tab: the browser is closed")
	}
	contextID, session, err := b.conn.openTab(ctx)
	if err != nil {
		return nil, b.fail(fmt.Errorf("browsertest: open a tab: %w", err))
	}
	return &Tab{b: b, contextID: contextID, session: session}, nil
}

// openTimeout bounds Tab's opening: a browser context and a page, which
// take a fraction of a second here, a few on a loaded CI machine.
const openTimeout = 30 * time.Second

// Tab opens a tab for the test (see NewTab) and closes it when the test
// and its subtests end. It fails the test if the tab does not open or
// close.
func (b *Browser) Tab(tb testing.TB) *Tab {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	t, err := b.NewTab(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := t.Close(); err != nil {
			tb.Error(err)
		}
	})
	return t
}

// Eval navigates the tab to pageURL, waits for the page to load, and
// evaluates expression there, as Browser.Eval does but in the tab's
// browser context. ctx bounds the call; one cut short leaves the browser
// unusable.
func (t *Tab) Eval(ctx context.Context, pageURL, expression string, out any) error {
	wrapped, err := wrap(pageURL, expression)
	if err != nil {
		return err
	}
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	if t.closed {
		return fmt.Errorf("browsertest: eval on %s: the tab is closed", pageURL)
	}
	return t.b.evalIn(ctx, t.session, pageURL, wrapped, out)
}

// Fetch evaluates fetch(fetchURL) on the page at pageURL (see Eval) with
// the cache bypassed, and returns the response the page saw.
func (t *Tab) Fetch(ctx context.Context, pageURL, fetchURL string) (Response, error) {
	return fetch(ctx, t.Eval, pageURL, fetchURL)
}

// Close disposes of the tab's browser context, which closes its page.
// Once the browser is closed, or unusable after a call cut short, there is
// nothing to dispose of: the browser's Close ends every process. Calling
// it again does nothing.
func (t *Tab) Close() error {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	if t.closed || t.b.down {
		t.closed = true
		return nil
	}
	t.closed = true
	if err := t.b.conn.disposeContext(context.Background(), t.contextID); err != nil {
		return fmt.Errorf("browsertest: close a tab: %w", err)
	}
	return nil
}
