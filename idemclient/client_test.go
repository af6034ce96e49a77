package idemclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/problem"
)

// attempt is what the test server saw of one request.
type attempt struct {
	method string
	keys   []string
	body   string
}

// recorder is a test server answering attempt n with answer(n, w, r).
type recorder struct {
	mu       sync.Mutex
	attempts []attempt
}

func (rec *recorder) seen() []attempt {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]attempt(nil), rec.attempts...)
}

// server starts a test server; answer gets the 1-based attempt number.
func server(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) (*httptest.Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.attempts = append(rec.attempts, attempt{method: r.Method, keys: r.Header.Values(idemclient.HeaderKey), body: string(b)})
		n := len(rec.attempts)
		rec.mu.Unlock()
		answer(n, w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, rec
}

// sleeps records the waits a client asked for, without sleeping.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) delays() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// newClient returns a client that never sleeps, on a transport without
// keep-alives (so net/http never retries a request on its own: every attempt
// the server sees is one of the client's).
func newClient(t *testing.T, cfg *idemclient.Config) (*idemclient.Client, *sleeps) {
	t.Helper()
	s := &sleeps{}
	if cfg == nil {
		cfg = &idemclient.Config{}
	}
	if cfg.Sleep == nil {
		cfg.Sleep = s.sleep
	}
	if cfg.HTTPClient == nil {
		tr := &http.Transport{DisableKeepAlives: true}
		t.Cleanup(tr.CloseIdleConnections)
		cfg.HTTPClient = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	c, err := idemclient.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, s
}

// hijackClose kills the connection without any response, after the request
// was read: the client cannot know whether it executed.
func hijackClose(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	_ = conn.Close()
}

func writeProblem(w http.ResponseWriter, status int, typ string, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	problem.WriteError(w, status, typ, "t", "d")
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// checkSameKeyAndBody asserts every attempt carried one and the same key and
// the same body, and returns the key.
func checkSameKeyAndBody(t *testing.T, as []attempt, body string) string {
	t.Helper()
	if len(as) == 0 {
		t.Fatal("no attempts")
	}
	key := ""
	for i, a := range as {
		if len(a.keys) != 1 {
			t.Fatalf("attempt %d: Idempotency-Key headers %q, want exactly one", i+1, a.keys)
		}
		if i == 0 {
			key = a.keys[0]
		} else if a.keys[0] != key {
			t.Errorf("attempt %d: key %q, want the first attempt's %q (rule X3)", i+1, a.keys[0], key)
		}
		if a.body != body {
			t.Errorf("attempt %d: body %q, want %q", i+1, a.body, body)
		}
	}
	return key
}

func TestSameKeyAfterNetworkErrors(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			hijackClose(t, w)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	var retries []idemclient.Retry
	c, _ := newClient(t, &idemclient.Config{OnRetry: func(r idemclient.Retry) { retries = append(retries, r) }})
	body := `{"amount":"10.00"}`
	resp, err := c.Do(post(t, srv.URL, body))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if resp.StatusCode != http.StatusCreated || readBody(t, resp) != "ok" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	as := rec.seen()
	if len(as) != 3 {
		t.Fatalf("%d attempts, want 3", len(as))
	}
	key := checkSameKeyAndBody(t, as, body)
	u, err := uuid.Parse(key)
	if err != nil || u.Version() != 7 {
		t.Errorf("generated key %q: want a UUIDv7 (%v)", key, err)
	}
	if got := resp.Request.Header.Get(idemclient.HeaderKey); got != key {
		t.Errorf("resp.Request key %q, want %q", got, key)
	}
	if len(retries) != 2 {
		t.Fatalf("OnRetry called %d times, want 2", len(retries))
	}
	for i, r := range retries {
		if r.Err == nil || r.StatusCode != 0 || r.Key != key || r.Attempt != i+1 {
			t.Errorf("retry %d: %+v", i, r)
		}
	}
}

func TestNetworkErrorsExhausted(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { hijackClose(t, w) })
	c, _ := newClient(t, &idemclient.Config{MaxAttempts: 3})
	resp, err := c.Do(post(t, srv.URL, `{}`))
	if resp != nil {
		t.Fatalf("got a response: %d", resp.StatusCode)
	}
	var e *idemclient.Error
	if !errors.As(err, &e) {
		t.Fatalf("err %v (%T), want *idemclient.Error", err, err)
	}
	as := rec.seen()
	key := checkSameKeyAndBody(t, as, `{}`)
	if e.Attempts != 3 || len(as) != 3 || e.Key != key || e.Method != http.MethodPost {
		t.Errorf("Error %+v, %d attempts seen, key %q", e, len(as), key)
	}
}

func TestSameKeyAndBodyAfter503(t *testing.T) {
	t.Parallel()
	for _, getBody := range []bool{true, false} {
		t.Run("GetBody="+strconv.FormatBool(getBody), func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n <= 3 {
					writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "")
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			c, s := newClient(t, &idemclient.Config{BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Second})
			body := strings.Repeat("x", 10_000)
			req := post(t, srv.URL, body)
			if !getBody {
				req.GetBody = nil
				req.Body = io.NopCloser(strings.NewReader(body))
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			as := rec.seen()
			if len(as) != 4 {
				t.Fatalf("%d attempts, want 4", len(as))
			}
			checkSameKeyAndBody(t, as, body)
			if req.Header.Get(idemclient.HeaderKey) != "" {
				t.Error("Do modified the caller's request")
			}
			// Full jitter: retry n waits in [0, 100ms * 2^(n-1)].
			ds := s.delays()
			if len(ds) != 3 {
				t.Fatalf("delays %v", ds)
			}
			for i, d := range ds {
				if ceil := 100 * time.Millisecond << i; d < 0 || d > ceil {
					t.Errorf("delay %d = %s, want within [0, %s]", i+1, d, ceil)
				}
			}
		})
	}
}

func TestCallerKeyKept(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodPost, http.MethodPut, "MOVE"} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.WriteHeader(http.StatusBadGateway)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			c, _ := newClient(t, nil)
			req, _ := http.NewRequest(method, srv.URL, strings.NewReader("b"))
			req, err := idemclient.WithKey(req, "op-2026-0001")
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			resp.Body.Close()
			as := rec.seen()
			if len(as) != 2 {
				t.Fatalf("%d attempts, want 2 (a keyed request is retried, whatever its method)", len(as))
			}
			if key := checkSameKeyAndBody(t, as, "b"); key != "op-2026-0001" {
				t.Errorf("key %q, want the caller's", key)
			}
		})
	}
}

func TestWithKeyRejectsMalformed(t *testing.T) {
	t.Parallel()
	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid", nil)
	for _, k := range []string{"", "a b", strings.Repeat("k", 256), "é", `a"b`, `"abc"`} {
		if _, err := idemclient.WithKey(req, k); err == nil {
			t.Errorf("WithKey(%q) accepted", k)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		want   time.Duration
	}{
		{"3", 3 * time.Second},
		{"60", time.Minute}, // not capped at MaxDelay (10s); at most MaxRetryAfter (1m), jitter included
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.Header().Set("Retry-After", tt.header)
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			c, s := newClient(t, nil)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			resp.Body.Close()
			// 60s: no jitter, which would pass MaxRetryAfter.
			if ds := s.delays(); len(ds) != 1 || !jittered(ds[0], tt.want) || (tt.want == time.Minute && ds[0] != tt.want) {
				t.Errorf("delays %v, want [%s] plus its jitter", ds, tt.want)
			}
		})
	}
}

// A Retry-After of zero, or an HTTP-date already past, gives no wait: the
// client backs off as without the header, instead of retrying a server
// under load back to back; a positive one is still honoured.
func TestRetryAfterZeroBacksOff(t *testing.T) {
	t.Parallel()
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	backoff := func(n int) time.Duration { return time.Duration(n) * 300 * time.Millisecond }
	for _, tt := range []struct {
		name    string
		headers []string // Retry-After of the 503s, one per attempt
		cfg     idemclient.Config
		want    []time.Duration
	}{
		{"zero, Backoff", []string{"0", "0", "0"}, idemclient.Config{Backoff: backoff},
			[]time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond}},
		{"past date, Backoff", []string{past, past}, idemclient.Config{Backoff: backoff},
			[]time.Duration{300 * time.Millisecond, 600 * time.Millisecond}},
		{"zero then positive, Backoff", []string{"0", "2"}, idemclient.Config{Backoff: backoff, RetryAfterJitter: idemclient.NoRetryAfterJitter},
			[]time.Duration{300 * time.Millisecond, 2 * time.Second}},
		{"zero, Backoff capped at MaxDelay", []string{"0"}, idemclient.Config{Backoff: func(int) time.Duration { return time.Hour }},
			[]time.Duration{10 * time.Second}},
		{"zero, jittered backoff", []string{"0", "0", "0", "0"}, idemclient.Config{BaseDelay: time.Second, MaxDelay: 10 * time.Second}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n <= len(tt.headers) {
					w.Header().Set("Retry-After", tt.headers[n-1])
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			cfg := tt.cfg
			c, s := newClient(t, &cfg)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			resp.Body.Close()
			ds := s.delays()
			if tt.want != nil {
				if !slices.Equal(ds, tt.want) {
					t.Errorf("delays %v, want %v", ds, tt.want)
				}
				return
			}
			// Full jitter: each wait in [0, min(MaxDelay, 1s*2^(n-1))], and
			// four waits of zero are next to impossible.
			var total time.Duration
			for i, d := range ds {
				if ceil := time.Second << i; d < 0 || d > ceil {
					t.Errorf("delay %d: %v, want within [0, %v]", i+1, d, ceil)
				}
				total += d
			}
			if len(ds) != len(tt.headers) || total == 0 {
				t.Errorf("delays %v; want %d jittered backoffs, not back-to-back retries", ds, len(tt.headers))
			}
		})
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(5 * time.Second)
	srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", at.UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	c, s := newClient(t, nil)
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	resp.Body.Close()
	// The HTTP-date has whole seconds: the wait is 4 to 5 seconds, plus
	// at most a tenth of it.
	if ds := s.delays(); len(ds) != 1 || ds[0] < 3*time.Second || ds[0] > 5500*time.Millisecond {
		t.Errorf("delays %v, want one of about 5s", ds)
	}
}

func TestRequestInProgressRetried(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			writeProblem(w, http.StatusConflict, problem.TypeRequestInProgress, "2")
			return
		}
		w.Header().Set(idemclient.HeaderReplayed, "true")
		w.WriteHeader(http.StatusCreated)
	})
	var info idemclient.Retry
	c, s := newClient(t, &idemclient.Config{OnRetry: func(r idemclient.Retry) { info = r }})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !idemclient.Replayed(resp) {
		t.Errorf("status %d, replayed %v", resp.StatusCode, idemclient.Replayed(resp))
	}
	checkSameKeyAndBody(t, rec.seen(), "{}")
	ds := s.delays()
	if len(ds) != 1 || !jittered(ds[0], 2*time.Second) {
		t.Errorf("delays %v, want one of 2s from Retry-After, plus its jitter", ds)
	}
	if info.StatusCode != http.StatusConflict || info.ProblemType != problem.TypeRequestInProgress || len(ds) != 1 || info.Delay != ds[0] {
		t.Errorf("OnRetry got %+v", info)
	}
}

// TestRequestInProgressExhausted: a 409 request-in-progress on the last
// attempt is not returned as a response a caller would read as a conflict,
// but as an error saying the operation is still running, with its key.
func TestRequestInProgressExhausted(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusConflict, problem.TypeRequestInProgress, "1")
	})
	c, _ := newClient(t, &idemclient.Config{MaxAttempts: 3})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("Do returned a response %d; want none and ErrInProgress", resp.StatusCode)
	}
	if !errors.Is(err, idemclient.ErrInProgress) {
		t.Fatalf("Do: %v; want ErrInProgress", err)
	}
	var e *idemclient.Error
	seen := rec.seen()
	if !errors.As(err, &e) || e.Attempts != 3 || e.Key == "" || len(seen) != 3 || len(seen[0].keys) != 1 || e.Key != seen[0].keys[0] {
		t.Errorf("error %#v after %d attempts; want an *Error with the key of the attempts and 3 attempts", err, len(seen))
	}
}

func TestKeyReusedNotRetried(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusConflict, http.StatusUnprocessableEntity} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				writeProblem(w, status, problem.TypeKeyReused, "")
			})
			c, _ := newClient(t, nil)
			req, _ := idemclient.WithKey(post(t, srv.URL, "{}"), "k-1")
			resp, err := c.Do(req)
			if resp != nil {
				t.Fatalf("got a response %d", resp.StatusCode)
			}
			var e *idemclient.KeyReusedError
			if !errors.As(err, &e) || !errors.Is(err, idemclient.ErrKeyReused) {
				t.Fatalf("err %v, want a *KeyReusedError", err)
			}
			if e.Key != "k-1" || e.StatusCode != status || e.Problem.Type != problem.TypeKeyReused || e.Problem.Detail != "d" {
				t.Errorf("KeyReusedError %+v", e)
			}
			if n := len(rec.seen()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
}

func TestRetriedStatuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		typ    string
	}{
		{http.StatusRequestTimeout, ""},
		{http.StatusTooEarly, ""},
		{http.StatusTooManyRequests, ""},
		{http.StatusInternalServerError, ""},
		{http.StatusInternalServerError, problem.TypeTransactionAborted},
		{http.StatusBadGateway, ""},
		{http.StatusServiceUnavailable, problem.TypeStoreUnavailable},
		{http.StatusGatewayTimeout, ""},
		{http.StatusConflict, problem.TypeRequestInProgress},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status)+" "+strings.TrimPrefix(tt.typ, problem.TypeBase), func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				switch {
				case n > 1:
					w.WriteHeader(http.StatusCreated)
				case tt.typ != "":
					writeProblem(w, tt.status, tt.typ, "")
				default:
					w.WriteHeader(tt.status)
				}
			})
			c, _ := newClient(t, nil)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if n := len(rec.seen()); resp.StatusCode != http.StatusCreated || n != 2 {
				t.Errorf("status %d after %d attempts, want 201 after 2", resp.StatusCode, n)
			}
		})
	}
}

func TestFinalStatusesNotRetried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		typ    string
	}{
		{"400", http.StatusBadRequest, ""},
		{"400 key-missing", http.StatusBadRequest, problem.TypeKeyMissing},
		{"401", http.StatusUnauthorized, problem.TypeUnauthenticated},
		{"404", http.StatusNotFound, ""},
		{"409 business conflict", http.StatusConflict, ""},
		{"409 other problem", http.StatusConflict, problem.TypeValidation},
		{"413", http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge},
		{"422 validation", http.StatusUnprocessableEntity, problem.TypeValidation},
		{"422 request-in-progress", http.StatusUnprocessableEntity, problem.TypeRequestInProgress},
		{"500 response-too-large", http.StatusInternalServerError, problem.TypeResponseTooLarge},
		// The handler ended idem's transaction: its effect may have been
		// applied and nothing records it, so a retry executes it again.
		{"500 transaction-ended", http.StatusInternalServerError, problem.TypeTransactionEnded},
		{"501", http.StatusNotImplemented, ""},
		{"201", http.StatusCreated, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				if tt.typ != "" {
					writeProblem(w, tt.status, tt.typ, "1")
					return
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, "plain")
			})
			c, _ := newClient(t, nil)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if n := len(rec.seen()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
			// The body is intact even when the client peeked at it.
			if tt.typ != "" {
				var p problem.Problem
				if err := p.UnmarshalJSON([]byte(body)); err != nil || p.Type != tt.typ {
					t.Errorf("body %q: %v", body, err)
				}
			} else if body != "plain" {
				t.Errorf("body %q", body)
			}
		})
	}
}

// A 500 response-too-large saying "stored": false is the handler's own
// failure, too large to pass on: nothing was stored and the key is free, so
// it is retried like any 500. Without that member (the outcome stored, or a
// server that does not say) it stays final.
func TestResponseTooLargeNotStoredRetried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		ext      map[string]any
		attempts int
	}{
		{"stored false", map[string]any{"stored": false}, 2},
		{"stored true", map[string]any{"stored": true}, 1},
		{"stored string", map[string]any{"stored": "false"}, 1},
		{"no stored member", nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					problem.Write(w, problem.Problem{Status: 500, Type: problem.TypeResponseTooLarge, Extensions: tt.ext})
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			c, _ := newClient(t, nil)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if n := len(rec.seen()); n != tt.attempts {
				t.Errorf("%d attempts, want %d (last: %d %s)", n, tt.attempts, resp.StatusCode, body)
			}
		})
	}
}

// A 500 transaction-ended is final even when its document is larger than
// what the client peeks at (64 KiB): the type member comes first and is read
// on its own. A problem+json 500 whose type cannot be read (cut off before
// it, invalid, unreadable) is final too: it may be transaction-ended, and a
// retry would execute the command again.
func TestLarge500ProblemNotRetried(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 70<<10)
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
	}{
		{"transaction-ended with a large member after the type", func(w http.ResponseWriter) {
			problem.Write(w, problem.Problem{Status: 500, Type: problem.TypeTransactionEnded,
				Extensions: map[string]any{"trace": big}})
		}},
		{"type after a large member", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", problem.MediaType)
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"trace":"`+big+`","type":"`+problem.TypeTransactionEnded+`"}`)
		}},
		{"invalid JSON", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", problem.MediaType+"; charset=utf-8")
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"type": transaction-ended}`)
		}},
		{"body cut before the type", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", problem.MediaType)
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"title":"Internal`)
			// The handler returns: the body ends 82 bytes short.
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { tt.answer(w) })
			c, _ := newClient(t, &idemclient.Config{MaxAttempts: 3})
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if n := len(rec.seen()); n != 1 || resp.StatusCode != 500 {
				t.Errorf("%d attempts, status %d; want the 500 after 1 attempt", n, resp.StatusCode)
			}
		})
	}
}

// A problem document with a member twice is one whose type cannot be read
// (problem.Problem refuses it: encoding/json would keep the last type, a
// reader of the first members the first one): the classification never
// goes by one occurrence while the decoded Problem says the other. A 500
// is then final (it may be transaction-ended), a 409 or 422 is returned as
// it is, never as a *KeyReusedError, and both take one attempt.
func TestDuplicateProblemMembers(t *testing.T) {
	t.Parallel()
	doc := func(members ...string) string { return "{" + strings.Join(members, ",") + "}" }
	typ := func(t string) string { return `"type":"` + t + `"` }
	tests := []struct {
		name   string
		status int
		body   string
	}{
		{"500 transaction-ended second", 500, doc(typ("about:blank"), typ(problem.TypeTransactionEnded))},
		{"500 transaction-ended first", 500, doc(typ(problem.TypeTransactionEnded), typ("about:blank"))},
		{"500 response-too-large, stored twice", 500, doc(typ(problem.TypeResponseTooLarge), `"stored":true`, `"stored":false`)},
		{"409 key-reused first", 409, doc(typ(problem.TypeKeyReused), typ(problem.TypeConflict))},
		{"409 key-reused second", 409, doc(typ(problem.TypeConflict), typ(problem.TypeKeyReused))},
		{"422 key-reused twice", 422, doc(typ(problem.TypeKeyReused), `"status":422`, typ(problem.TypeKeyReused))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n > 1 {
					w.WriteHeader(http.StatusCreated)
					return
				}
				w.Header().Set("Content-Type", problem.MediaType)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			var p problem.Problem
			if err := json.Unmarshal([]byte(tt.body), &p); err == nil {
				t.Errorf("problem.Problem decodes %s to %+v; want it refused", tt.body, p)
			}
			c, _ := newClient(t, &idemclient.Config{MaxAttempts: 3})
			req, _ := idemclient.WithKey(post(t, srv.URL, "{}"), "k-1")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("Do: %v; want the %d returned as it is", err, tt.status)
			}
			body := readBody(t, resp)
			if n := len(rec.seen()); n != 1 || resp.StatusCode != tt.status || body != tt.body {
				t.Errorf("%d attempts, status %d, body %s; want the %d after 1 attempt", n, resp.StatusCode, body, tt.status)
			}
		})
	}
}

// A 500 that is not a problem document, or a problem document whose type
// is read (even past 64 KiB of members after it), is retried as before.
func TestLarge500Retried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
	}{
		{"plain text", func(w http.ResponseWriter) {
			w.WriteHeader(500)
			_, _ = io.WriteString(w, strings.Repeat("x", 70<<10))
		}},
		{"transaction-aborted with a large member", func(w http.ResponseWriter) {
			problem.Write(w, problem.Problem{Status: 500, Type: problem.TypeTransactionAborted,
				Extensions: map[string]any{"trace": strings.Repeat("x", 70<<10)}})
		}},
		{"problem without type", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", problem.MediaType)
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"title":"Internal Server Error","status":500}`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					tt.answer(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			c, _ := newClient(t, nil)
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if n := len(rec.seen()); n != 2 || resp.StatusCode != http.StatusCreated {
				t.Errorf("%d attempts, status %d; want 201 after 2", n, resp.StatusCode)
			}
		})
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusServiceUnavailable, problem.TypeOutcomeUnknown, "")
	})
	c, s := newClient(t, &idemclient.Config{MaxAttempts: 3})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "outcome-unknown") {
		t.Errorf("last response %d %q, want the 503 with its body readable", resp.StatusCode, body)
	}
	as := rec.seen()
	if len(as) != 3 || len(s.delays()) != 2 {
		t.Errorf("%d attempts and %d waits, want 3 and 2", len(as), len(s.delays()))
	}
	key := checkSameKeyAndBody(t, as, "{}")
	if resp.Request.Header.Get(idemclient.HeaderKey) != key {
		t.Error("the key to re-issue with is not on resp.Request")
	}
}

func TestMaxAttemptsOne(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	c, _ := newClient(t, &idemclient.Config{MaxAttempts: 1})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := len(rec.seen()); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
}

func TestContextCancelDuringBackoff(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	// The real sleep, waiting 10s per retry.
	c, err := idemclient.New(&idemclient.Config{
		HTTPClient: &http.Client{Transport: tr},
		Backoff:    func(int) time.Duration { return time.Hour },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req := post(t, srv.URL, "{}").WithContext(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	resp, err := c.Do(req)
	// Generous for a loaded machine; the backoff is an hour.
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Errorf("Do returned after %s, want promptly after the cancel", elapsed)
	}
	if resp != nil {
		t.Fatalf("got a response %d", resp.StatusCode)
	}
	var e *idemclient.Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &e) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err %v: want context.Canceled wrapped with the last outcome (503)", err)
	}
	if e.Attempts != 1 || len(rec.seen()) != 1 || e.Key == "" {
		t.Errorf("Error %+v", e)
	}
}

func TestContextCanceledBeforeAttempt(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, _ := newClient(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Do(post(t, srv.URL, "{}").WithContext(ctx))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d attempts reached the server", n)
	}
}

func TestDeadlineGivesUpEarly(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusConflict, problem.TypeRequestInProgress, "5")
	})
	for _, viaCtx := range []bool{true, false} {
		t.Run("ctx="+strconv.FormatBool(viaCtx), func(t *testing.T) {
			cfg := &idemclient.Config{}
			req := post(t, srv.URL, "{}")
			if viaCtx {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				req = req.WithContext(ctx)
			} else {
				cfg.MaxElapsed = 3 * time.Second
			}
			c, s := newClient(t, cfg)
			before := len(rec.seen())
			start := time.Now()
			resp, err := c.Do(req)
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("Do returned %d; want an error: the server asked for a longer wait than the budget", resp.StatusCode)
			}
			// No sleep, one attempt; and answered before the 3s budget
			// ran out (generous for a loaded machine).
			if time.Since(start) > 2500*time.Millisecond || len(s.delays()) != 0 || len(rec.seen())-before != 1 {
				t.Errorf("waited %v; want to give up at once since Retry-After 5s ends after the budget", s.delays())
			}
			var e *idemclient.Error
			var ra *idemclient.RetryAfterError
			if !errors.As(err, &e) || !errors.As(err, &ra) || !errors.Is(err, idemclient.ErrRetryAfter) {
				t.Fatalf("err %v, want an *Error with a *RetryAfterError", err)
			}
			if e.Key == "" || e.Attempts != 1 || ra.StatusCode != http.StatusConflict ||
				ra.ProblemType != problem.TypeRequestInProgress || ra.RetryAfter != 5*time.Second {
				t.Errorf("got %+v, %+v", e, ra)
			}
		})
	}
}

func TestGetRetriedWithoutKey(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			hijackClose(t, w)
			return
		}
		if n == 2 {
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		_, _ = io.WriteString(w, "got")
	})
	c, _ := newClient(t, nil)
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if b := readBody(t, resp); b != "got" {
		t.Errorf("body %q", b)
	}
	as := rec.seen()
	if len(as) != 3 {
		t.Fatalf("%d attempts, want 3", len(as))
	}
	for _, a := range as {
		if len(a.keys) != 0 {
			t.Errorf("GET carried Idempotency-Key %q", a.keys)
		}
	}
}

func TestKeylessNonIdempotentNotRetried(t *testing.T) {
	t.Parallel()
	t.Run("503", func(t *testing.T) {
		t.Parallel()
		srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		c, s := newClient(t, &idemclient.Config{Methods: []string{http.MethodPatch}})
		resp, err := c.Do(post(t, srv.URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		as := rec.seen()
		if len(as) != 1 || len(s.delays()) != 0 || len(as[0].keys) != 0 || as[0].body != "{}" {
			t.Errorf("attempts %+v: want exactly one, keyless", as)
		}
	})
	t.Run("network error", func(t *testing.T) {
		t.Parallel()
		srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { hijackClose(t, w) })
		c, _ := newClient(t, &idemclient.Config{Methods: []string{}})
		_, err := c.Do(post(t, srv.URL, "{}"))
		if err == nil {
			t.Fatal("no error")
		}
		if n := len(rec.seen()); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
	})
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, _ := newClient(t, &idemclient.Config{MaxBodyBytes: 10})
	req := post(t, srv.URL, "")
	req.GetBody = nil
	req.Body = io.NopCloser(strings.NewReader("0123456789A"))
	if _, err := c.Do(req); !errors.Is(err, idemclient.ErrBodyTooLarge) {
		t.Fatalf("err %v, want ErrBodyTooLarge", err)
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d attempts sent", n)
	}
	// Exactly at the limit is fine, and so is any size with GetBody.
	req.Body = io.NopCloser(strings.NewReader("0123456789"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = c.Do(post(t, srv.URL, strings.Repeat("y", 100)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func TestRequestKeyHeaderChecks(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	c, _ := newClient(t, nil)
	req := post(t, srv.URL, "{}")
	req.Header.Add(idemclient.HeaderKey, "a")
	req.Header.Add(idemclient.HeaderKey, "b")
	if _, err := c.Do(req); err == nil {
		t.Error("two Idempotency-Key headers accepted")
	}
	req = post(t, srv.URL, "{}")
	req.Header.Set(idemclient.HeaderKey, " ")
	if _, err := c.Do(req); err == nil {
		t.Error("an empty Idempotency-Key accepted")
	}
	if n := len(rec.seen()); n != 0 {
		t.Errorf("%d attempts sent", n)
	}
}

func TestKeyGenerator(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	n := 0
	c, _ := newClient(t, &idemclient.Config{NewKey: func() (string, error) { n++; return "gen-" + strconv.Itoa(n), nil }})
	for range 2 {
		resp, err := c.Do(post(t, srv.URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	as := rec.seen()
	if len(as) != 2 || as[0].keys[0] != "gen-1" || as[1].keys[0] != "gen-2" {
		t.Errorf("attempts %+v: want one new key per operation", as)
	}

	bad, _ := newClient(t, &idemclient.Config{NewKey: func() (string, error) { return "", errors.New("no entropy") }})
	if _, err := bad.Do(post(t, srv.URL, "{}")); err == nil || !strings.Contains(err.Error(), "no entropy") {
		t.Errorf("err %v", err)
	}
	bad, _ = newClient(t, &idemclient.Config{NewKey: func() (string, error) { return "has space", nil }})
	if _, err := bad.Do(post(t, srv.URL, "{}")); err == nil {
		t.Error("malformed generated key accepted")
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	a, err := idemclient.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := idemclient.NewKey()
	if u, err := uuid.Parse(a); err != nil || u.Version() != 7 || a == b {
		t.Errorf("NewKey %q, %q: %v", a, b, err)
	}
}

func TestReplayed(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"true": true, "True": true, "": false, "false": false, "1": false} {
		resp := &http.Response{Header: http.Header{}}
		if v != "" {
			resp.Header.Set(idemclient.HeaderReplayed, v)
		}
		if got := idemclient.Replayed(resp); got != want {
			t.Errorf("Replayed(%q) = %v", v, got)
		}
	}
	if idemclient.Replayed(nil) {
		t.Error("Replayed(nil)")
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	bad := map[string]idemclient.Config{
		"negative attempts":     {MaxAttempts: -1},
		"negative base":         {BaseDelay: -time.Second},
		"negative max":          {MaxDelay: -time.Second},
		"max below base":        {BaseDelay: time.Second, MaxDelay: time.Millisecond},
		"negative elapsed":      {MaxElapsed: -time.Second},
		"negative retry-after":  {MaxRetryAfter: -time.Second},
		"negative jitter":       {RetryAfterJitter: -time.Second},
		"negative body limit":   {MaxBodyBytes: -1},
		"empty method":          {Methods: []string{""}},
		"method with space":     {Methods: []string{"PO ST"}},
		"method with separator": {Methods: []string{"POST,PATCH"}},
	}
	for name, cfg := range bad {
		if _, err := idemclient.New(&cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, cfg := range []*idemclient.Config{nil, {}, {MaxAttempts: 1, BaseDelay: time.Minute}, {Methods: []string{}}, {RetryAfterJitter: idemclient.NoRetryAfterJitter}} {
		if _, err := idemclient.New(cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

// A retry is logged at debug level, one line each, with the method, the
// URL's path, the attempt, the status and the wait; never the key, the
// body, a header or the query string.
func TestRetriesLoggedWithoutSecrets(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "")
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, _ := newClient(t, &idemclient.Config{Logger: log})
	const secretBody = `{"amount":"98765.43","card":"4111-SECRET"}`
	req := post(t, srv.URL+"/v1/payments?token=QUERY-SECRET", secretBody)
	req.Header.Set("Authorization", "Bearer HEADER-SECRET")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	resp.Body.Close()
	as := rec.seen()
	if len(as) != 3 {
		t.Fatalf("%d attempts, want 3", len(as))
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if n := strings.Count(out, `"msg":"idemclient: retrying"`); n != 2 {
		t.Fatalf("%d retry lines, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, `/v1/payments"`) || !strings.Contains(out, `"status":503`) {
		t.Errorf("retry lines lack the path or the status:\n%s", out)
	}
	for _, secret := range []string{as[0].keys[0], "98765.43", "4111-SECRET", "QUERY-SECRET", "HEADER-SECRET"} {
		if strings.Contains(out, secret) {
			t.Errorf("a log line carries %q:\n%s", secret, out)
		}
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
