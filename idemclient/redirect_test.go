package idemclient_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
)

// A redirect loop makes http.Client.Do return both a response (whose body
// it has already closed) and an error. Do must report the error (a nil
// response and an *Error), not hand over the closed response as final.
func TestRedirectLoopIsAnError(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
	})
	c, _ := newClient(t, nil)
	resp, err := c.Do(post(t, srv.URL+"/loop", `{"a":1}`))
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("Do returned a response (%s) and error %v; want no response", resp.Status, err)
	}
	var e *idemclient.Error
	if !errors.As(err, &e) {
		t.Fatalf("err %v, want an *idemclient.Error", err)
	}
	if e.Attempts != 1 {
		t.Errorf("%d attempts, want 1: a redirect policy error is not transient", e.Attempts)
	}
	// Every request of the redirect chain carried the key and the body.
	checkSameKeyAndBody(t, rec.seen(), `{"a":1}`)
}

// A key the caller set that no server can accept (not visible ASCII, or
// too long) is refused before anything is sent, like two key headers.
func TestRequestKeyHeaderMalformed(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, s := newClient(t, nil)
	for _, key := range []string{"a\x01b", strings.Repeat("k", 300)} {
		req := post(t, srv.URL, "{}")
		req.Header[idemclient.HeaderKey] = []string{key}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Errorf("key %q accepted", key)
		}
		var e *idemclient.Error
		if errors.As(err, &e) {
			t.Errorf("key %q: %v, want a plain error (nothing sent)", key, err)
		}
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d attempts sent", n)
	}
	if d := s.delays(); len(d) != 0 {
		t.Errorf("waits %v, want none", d)
	}
}

// A request sent with Do twice (a new operation reusing the request value,
// its Body read by the first Do) still sends its body on the first attempt
// of the second Do.
func TestRequestReusedSendsBody(t *testing.T) {
	t.Parallel()
	var bodies []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, err := idemclient.New(&idemclient.Config{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"n":1}`))
	for i := range 2 {
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("Do %d: %v", i, err)
		}
		_ = resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || bodies[0] != `{"n":1}` || bodies[1] != `{"n":1}` {
		t.Fatalf("bodies received: %q; want the body twice", bodies)
	}
}

// A request net/http refuses before dialling (a scheme it does not speak, a
// URL without a host) fails at once: another attempt would fail the same
// way, after the backoff.
func TestUnsendableRequestNotRetried(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"ftp://example.com/payments", "http:///payments"} {
		c, _ := newClient(t, nil)
		req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(`{"a":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		var e *idemclient.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: err %v, want an *idemclient.Error", u, err)
		}
		if e.Attempts != 1 {
			t.Errorf("%s: %d attempts, want 1", u, e.Attempts)
		}
	}
}

// A request whose header net/http refuses before dialling (an invalid field
// name or value), or a server-side request passed on as it is (RequestURI
// set), fails at once too: nothing was sent, and every retry fails the same
// way after its backoff.
func TestInvalidRequestNotRetried(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	for name, spoil := range map[string]func(*http.Request){
		"header value": func(r *http.Request) { r.Header.Set("X-Trace", "a\nb") },
		"header name":  func(r *http.Request) { r.Header["X Trace"] = []string{"v"} },
		"trailer":      func(r *http.Request) { r.Trailer = http.Header{"X Sum": {"v"}} },
		"RequestURI":   func(r *http.Request) { r.RequestURI = "/v1/payments" },
	} {
		c, s := newClient(t, nil)
		req := post(t, srv.URL, `{"a":1}`)
		spoil(req)
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		var e *idemclient.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: err %v, want an *idemclient.Error", name, err)
		}
		if e.Attempts != 1 || len(s.delays()) != 0 {
			t.Errorf("%s: %d attempts, waits %v; want 1 attempt, no wait", name, e.Attempts, s.delays())
		}
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d requests reached the server", n)
	}
}

// Plain HTTP behind an https:// URL (http.ErrSchemeMismatch) answers every
// attempt the same way: the first error is returned at once.
func TestSchemeMismatchNotRetried(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, s := newClient(t, nil)
	_, err := c.Do(post(t, strings.Replace(srv.URL, "http://", "https://", 1), "{}"))
	var e *idemclient.Error
	if !errors.As(err, &e) || !errors.Is(err, http.ErrSchemeMismatch) {
		t.Fatalf("err %v, want an *idemclient.Error wrapping http.ErrSchemeMismatch", err)
	}
	if e.Attempts != 1 || len(s.delays()) != 0 {
		t.Errorf("%d attempts, waits %v; want 1 attempt, no wait", e.Attempts, s.delays())
	}
}

// A ContentLength that is not the body's length is refused before anything
// is sent when Do buffers the body, and not retried when net/http refuses it
// (a body from GetBody).
func TestContentLengthMismatchNotRetried(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, s := newClient(t, nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader("abc")))
	req.ContentLength = 10
	resp, err := c.Do(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("a buffered body of 3 bytes sent with ContentLength 10")
	}
	var e *idemclient.Error
	if errors.As(err, &e) {
		t.Errorf("buffered body: err %v after %d attempts, want an error before sending", err, e.Attempts)
	}

	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("abc")) // with GetBody
	req.ContentLength = 10
	resp, err = c.Do(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("a body of 3 bytes from GetBody sent with ContentLength 10")
	}
	if !errors.As(err, &e) || e.Attempts != 1 || len(s.delays()) != 0 {
		t.Errorf("GetBody: err %v, waits %v; want one attempt, no wait", err, s.delays())
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d requests reached the server", n)
	}
}

// A 301 or 302 answering a command (a trailing-slash redirect, http to
// https behind a proxy) would be followed by http.Client as a GET without
// the body: the command never runs, and the GET's 200 (a list, a page)
// would come back as the command's success. Do returns the 301 or 302
// itself, unfollowed; the server saw the command once and nothing else.
// A 303 See Other (the command ran, its result is elsewhere) and the
// method-preserving 307 and 308 are still followed.
func TestRedirectChangingMethodNotFollowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status     int
		method     string
		wantStatus int
		wantSeen   []string // methods the server saw
		keyless    bool     // a POST sent once, without a key
	}{
		{http.StatusMovedPermanently, http.MethodPost, http.StatusMovedPermanently, []string{"POST"}, false},
		{http.StatusFound, http.MethodPost, http.StatusFound, []string{"POST"}, false},
		{http.StatusFound, http.MethodDelete, http.StatusFound, []string{"DELETE"}, false},
		{http.StatusMovedPermanently, http.MethodPatch, http.StatusMovedPermanently, []string{"PATCH"}, false},
		{http.StatusSeeOther, http.MethodPost, http.StatusOK, []string{"POST", "GET"}, false},
		{http.StatusTemporaryRedirect, http.MethodPost, http.StatusOK, []string{"POST", "POST"}, false},
		{http.StatusPermanentRedirect, http.MethodPost, http.StatusOK, []string{"POST", "POST"}, false},
		{http.StatusMovedPermanently, http.MethodGet, http.StatusOK, []string{"GET", "GET"}, false},
		{http.StatusFound, http.MethodPost, http.StatusFound, []string{"POST"}, true},
	} {
		srv, rec := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/payments" {
				http.Redirect(w, r, "/v1/payments/", tc.status)
				return
			}
			w.WriteHeader(http.StatusOK) // a list of payments, say
		})
		cfg := &idemclient.Config{}
		if tc.keyless {
			cfg.Methods = []string{}
		}
		c, s := newClient(t, cfg)
		req, err := http.NewRequest(tc.method, srv.URL+"/v1/payments", strings.NewReader(`{"a":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if tc.method == http.MethodDelete {
			req.Header.Set(idemclient.HeaderKey, "k-1")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%d after %s: %v", tc.status, tc.method, err)
		}
		_ = resp.Body.Close()
		var seen []string
		for _, a := range rec.seen() {
			seen = append(seen, a.method)
		}
		if resp.StatusCode != tc.wantStatus || !slices.Equal(seen, tc.wantSeen) {
			t.Errorf("%d after %s: Do returned %d, server saw %v; want %d, %v",
				tc.status, tc.method, resp.StatusCode, seen, tc.wantStatus, tc.wantSeen)
		}
		if d := s.delays(); len(d) != 0 {
			t.Errorf("%d after %s: waits %v, want none", tc.status, tc.method, d)
		}
	}
}

// The configured CheckRedirect still decides about the redirects Do
// follows.
func TestRedirectOwnPolicyKept(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/payments" {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	calls := 0
	hc := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		calls++
		return http.ErrUseLastResponse
	}}
	c, _ := newClient(t, &idemclient.Config{HTTPClient: hc})
	resp, err := c.Do(post(t, srv.URL+"/v1/payments", `{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || calls != 1 || len(rec.seen()) != 1 {
		t.Errorf("Do returned %d after %d CheckRedirect calls and %d requests; want 307, 1, 1",
			resp.StatusCode, calls, len(rec.seen()))
	}
}
