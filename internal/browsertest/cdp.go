package browsertest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// conn speaks the DevTools protocol over Chromium's debugging pipe: one
// JSON message per command or answer or event, each ended by a NUL byte.
// It is used by one goroutine at a time and reads only while it waits for
// something, so it needs no reader goroutine: answers are matched by id,
// and of the events only the lifecycle events that end a navigation are
// kept.
type conn struct {
	w    *os.File
	r    *os.File
	br   *bufio.Reader
	next int64
	// loaded holds the loader ids of the documents whose load event has
	// fired. A navigation's events may come before its answer.
	loaded map[string]bool
	// err, once set, fails every later call: a read cut short leaves half
	// a message in the pipe, so nothing after it can be trusted.
	err error
}

func newConn(w, r *os.File) *conn {
	return &conn{w: w, r: r, br: bufio.NewReader(r), loaded: make(map[string]bool)}
}

func (c *conn) close() {
	c.w.Close()
	c.r.Close()
}

type message struct {
	ID        int64           `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// openTab opens a page at about:blank in a browser context of its own
// (an empty cache and cookie jar), attaches to it and enables the
// lifecycle events that end its navigations. It returns the context's id
// and the page's session.
func (c *conn) openTab(ctx context.Context) (contextID, session string, err error) {
	var bc struct {
		ID string `json:"browserContextId"`
	}
	if err := c.call(ctx, "", "Target.createBrowserContext", map[string]any{"disposeOnDetach": true}, &bc); err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			c.disposeContext(ctx, bc.ID)
		}
	}()
	var target struct {
		ID string `json:"targetId"`
	}
	if err := c.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank", "browserContextId": bc.ID}, &target); err != nil {
		return "", "", err
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := c.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.ID, "flatten": true}, &attached); err != nil {
		return "", "", err
	}
	s := attached.SessionID
	if err := c.call(ctx, s, "Page.enable", nil, nil); err != nil {
		return "", "", err
	}
	if err := c.call(ctx, s, "Page.setLifecycleEventsEnabled", map[string]any{"enabled": true}, nil); err != nil {
		return "", "", err
	}
	return bc.ID, s, nil
}

// disposeContext disposes of a browser context that openTab opened, and
// so closes its page and ends the renderer's work for it. It does nothing
// once the connection is broken: nothing can be sent, and the browser's
// Close ends everything. It runs even when ctx is done, bounded by
// closeTimeout.
func (c *conn) disposeContext(ctx context.Context, id string) error {
	if c.err != nil {
		return nil
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	return c.call(dctx, "", "Target.disposeBrowserContext", map[string]any{"browserContextId": id}, nil)
}

// eval navigates the page of session to pageURL, waits for that
// navigation's load event, runs expression in it and returns the JSON of
// its value (nil for undefined).
func (c *conn) eval(ctx context.Context, session, pageURL, expression string) (json.RawMessage, error) {
	s := session
	var nav struct {
		LoaderID  string `json:"loaderId"`
		ErrorText string `json:"errorText"`
	}
	if err := c.call(ctx, s, "Page.navigate", map[string]any{"url": pageURL}, &nav); err != nil {
		return nil, err
	}
	if nav.ErrorText != "" {
		return nil, fmt.Errorf("navigate: %s", nav.ErrorText)
	}
	if err := c.until(ctx, "waiting for the page's load event", func(message) bool { return c.loaded[nav.LoaderID] }); err != nil {
		return nil, err
	}
	delete(c.loaded, nav.LoaderID)
	var res struct {
		Result struct {
			Type  string          `json:"type"`
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception *struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	params := map[string]any{"expression": expression, "awaitPromise": true, "returnByValue": true}
	if err := c.call(ctx, s, "Runtime.evaluate", params, &res); err != nil {
		return nil, err
	}
	if e := res.ExceptionDetails; e != nil {
		if e.Exception != nil && e.Exception.Description != "" {
			return nil, fmt.Errorf("the expression threw: %s", e.Exception.Description)
		}
		return nil, fmt.Errorf("the expression threw: %s", e.Text)
	}
	return res.Result.Value, nil
}

// call sends a command (to the browser when session is "", else to that
// page) and stores its answer's result in result, unless result is nil.
func (c *conn) call(ctx context.Context, session, method string, params, result any) error {
	if c.err != nil {
		return c.err
	}
	c.next++
	id := c.next
	m := message{ID: id, SessionID: session, Method: method}
	if params != nil {
		p, err := json.Marshal(params)
		if err != nil {
			return err
		}
		m.Params = p
	}
	out, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := c.guard(ctx, method, func() error {
		_, err := c.w.Write(append(out, 0))
		return err
	}); err != nil {
		return err
	}
	var answer message
	if err := c.until(ctx, method, func(m message) bool {
		answer = m
		return m.ID == id
	}); err != nil {
		return err
	}
	if e := answer.Error; e != nil {
		return fmt.Errorf("%s: %s (%d)", method, e.Message, e.Code)
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(answer.Result, result)
}

// until reads messages, noting load events on the way, until done returns
// true for one.
func (c *conn) until(ctx context.Context, what string, done func(message) bool) error {
	return c.guard(ctx, what, func() error {
		for {
			line, err := c.br.ReadBytes(0)
			if err != nil {
				return err
			}
			var m message
			if err := json.Unmarshal(line[:len(line)-1], &m); err != nil {
				return fmt.Errorf("bad message from the browser: %w", err)
			}
			if m.Method == "Page.lifecycleEvent" {
				var e struct {
					LoaderID string `json:"loaderId"`
					Name     string `json:"name"`
				}
				if json.Unmarshal(m.Params, &e) == nil && e.Name == "load" {
					c.loaded[e.LoaderID] = true
				}
			}
			if done(m) {
				return nil
			}
		}
	})
}

// guard runs io, which reads or writes the pipe, so that ctx ends it: the
// pipe's deadline is set to the past when ctx is done. An error of io's
// sticks (see conn.err).
func (c *conn) guard(ctx context.Context, what string, io func() error) error {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		c.r.SetDeadline(time.Now())
		c.w.SetDeadline(time.Now())
	})
	err := io()
	if !stop() {
		// ctx ended while io ran or just after: let the deadline be
		// set, then clear it for the next call if io got through.
		<-fired
		c.r.SetDeadline(time.Time{})
		c.w.SetDeadline(time.Time{})
	}
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = context.Cause(ctx)
	}
	c.err = fmt.Errorf("%s: %w", what, err)
	return c.err
}
