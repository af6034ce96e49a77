package idemclient_test

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemclient"
)

// A request built without a Header map, which http.Client.Do accepts, is
// sent with its key (Do and WithKey panicked on the nil map).
func TestRequestWithoutHeaderMap(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
	c, _ := newClient(t, nil)
	u, _ := url.Parse(srv.URL + "/v1/payments")
	req := &http.Request{Method: http.MethodPost, URL: u, Body: http.NoBody}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Do panicked: %v", p)
		}
	}()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	r2, err := idemclient.WithKey(&http.Request{Method: http.MethodPost, URL: u, Body: http.NoBody}, "k-1")
	if err != nil || r2.Header.Get(idemclient.HeaderKey) != "k-1" {
		t.Errorf("WithKey on a request without a Header map: %v, %v", r2, err)
	}
}

// MaxBodyBytes = MaxInt64 ("no limit") buffers the whole body (MaxBodyBytes+1
// overflowed and an empty body was sent).
func TestMaxBodyBytesNoLimit(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
	c, _ := newClient(t, &idemclient.Config{MaxBodyBytes: math.MaxInt64})
	req := post(t, srv.URL, `{"amount":"1"}`)
	req.GetBody = nil // e.g. a body from a file or pipe
	req.Body = io.NopCloser(strings.NewReader(`{"amount":"1"}`))
	req.ContentLength = 0 // unknown length
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if as := rec.seen(); len(as) != 1 || as[0].body != `{"amount":"1"}` {
		t.Fatalf("server saw %+v, want the body", as)
	}
}

// The retry log of a transport error does not carry the URL's query (the
// error names the whole URL).
func TestTransportErrorLoggedWithoutQuery(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			hijackClose(t, w)
			return
		}
		w.WriteHeader(201)
	})
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, _ := newClient(t, &idemclient.Config{Logger: log})
	resp, err := c.Do(post(t, srv.URL+"/v1/payments?token=QUERY-SECRET", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "QUERY-SECRET") {
		t.Errorf("log carries the query:\n%s", logs.String())
	}
}

// A key set under a non-canonical header name (a Header map written
// directly) is the request's key: Do sends it, alone, under the canonical
// name (it generated a second key, and the server refused the two).
func TestKeyUnderNonCanonicalName(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	c, _ := newClient(t, nil)
	req := post(t, srv.URL, "{}")
	lower := "idempotency-key"
	req.Header[lower] = []string{"my-op-1"}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if as := rec.seen(); len(as) != 1 || len(as[0].keys) != 1 || as[0].keys[0] != "my-op-1" {
		t.Errorf("server saw %+v, want one attempt with the one key my-op-1", as)
	}
	if got := req.Header[lower]; len(got) != 1 {
		t.Errorf("the caller's request was modified: %v", req.Header)
	}
}

// Keys under several spellings of the header name are several keys: refused
// before anything is sent, like two Idempotency-Key headers.
func TestKeysUnderSeveralNamesRefused(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	c, _ := newClient(t, nil)
	for _, names := range [][]string{{"idempotency-key", "IDEMPOTENCY-KEY"}, {idemclient.HeaderKey, "idempotency-key"}} {
		req := post(t, srv.URL, "{}")
		for _, n := range names {
			req.Header[n] = []string{"my-op-1"}
		}
		if resp, err := c.Do(req); err == nil {
			_ = resp.Body.Close()
			t.Errorf("%v: keys under two names accepted", names)
		}
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d attempts sent", n)
	}
}

// A hand-built request without a Method is a GET for net/http, and is
// retried as one (it was taken for a keyless non-idempotent request and
// sent once).
func TestEmptyMethodIsGet(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	c, _ := newClient(t, nil)
	u, _ := url.Parse(srv.URL + "/v1/payments/7")
	resp, err := c.Do(&http.Request{URL: u, Header: http.Header{}})
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	as := rec.seen()
	if resp.StatusCode != http.StatusOK || len(as) != 2 {
		t.Fatalf("status %d after %d attempts, want 200 after 2", resp.StatusCode, len(as))
	}
	if as[0].method != http.MethodGet || len(as[0].keys) != 0 {
		t.Errorf("sent %s with keys %v, want a keyless GET", as[0].method, as[0].keys)
	}
}

// The query of the URL may hold secrets (the retry logs leave it out): an
// *Error's message and the *url.Error it wraps do not carry it.
func TestErrorWithoutQuery(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t, &idemclient.Config{MaxAttempts: 2})
	req := post(t, "http://127.0.0.1:1/pay?api_key=SECRET", "{}")
	_, err := c.Do(req)
	var e *idemclient.Error
	if !errors.As(err, &e) {
		t.Fatalf("err %v, want an *idemclient.Error", err)
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("message carries the query: %v", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Fatalf("err %v wraps no *url.Error", err)
	}
	if strings.Contains(ue.URL, "SECRET") || !strings.HasPrefix(ue.URL, "http://127.0.0.1:1/pay") {
		t.Errorf("url.Error URL %q", ue.URL)
	}
	if !strings.Contains(req.URL.RawQuery, "SECRET") {
		t.Errorf("the request's URL was modified: %v", req.URL)
	}
}

// A keyless request sent once (a POST when POST is not in Config.Methods)
// that fails without a response gives an *Error whose message and
// *url.Error leave out the URL's query, like a retried one's.
func TestKeylessErrorWithoutQuery(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t, &idemclient.Config{Methods: []string{}})
	req := post(t, "http://127.0.0.1:1/pay?api_key=SECRET", "{}")
	resp, err := c.Do(req)
	if resp != nil {
		t.Fatalf("response %v with err %v, want none", resp.Status, err)
	}
	var e *idemclient.Error
	if !errors.As(err, &e) {
		t.Fatalf("err %v, want an *idemclient.Error", err)
	}
	if e.Attempts != 1 || e.Key != "" || e.Method != http.MethodPost {
		t.Errorf("Error %+v, want 1 keyless POST attempt", e)
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("message carries the query: %v", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Fatalf("err %v wraps no *url.Error", err)
	}
	if strings.Contains(ue.URL, "SECRET") {
		t.Errorf("url.Error URL %q carries the query", ue.URL)
	}
}
