package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// checkProblem asserts an RFC 9457 answer with status and type.
func checkProblem(t *testing.T, rr interface {
	Result() *http.Response
}, status int, typ string) {
	t.Helper()
	res := rr.Result()
	if res.StatusCode != status {
		t.Fatalf("status = %d, want %d; body %s", res.StatusCode, status, body(t, res.Body))
	}
	if ct := res.Header.Get("Content-Type"); ct != problem.MediaType {
		t.Fatalf("Content-Type = %q, want %q", ct, problem.MediaType)
	}
	if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control = %q, want no-store", cc)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if p.Type != typ || p.Status != status {
		t.Fatalf("problem = %+v, want type %s status %d", p, typ, status)
	}
}

func TestKeyRequired(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, nil, effectHandler(t, e, 201, &calls))
		checkProblem(t, send(h, "POST", "/pay", "", `{}`), 400, problem.TypeKeyMissing)
		checkProblem(t, send(h, "POST", "/pay", "a b", `{}`), 400, problem.TypeKeyMalformed)
		checkProblem(t, send(h, "POST", "/pay", strings.Repeat("k", 256), `{}`), 400, problem.TypeKeyMalformed)
		checkProblem(t, send(h, "PATCH", "/pay", "ключ", `{}`), 400, problem.TypeKeyMalformed)
		checkProblem(t, send(h, "POST", "/pay", "k1", `{}`, "Idempotency-Key", "k2"), 400, problem.TypeKeyMultiple)
		if n := calls.Load(); n != 0 {
			t.Fatalf("handler ran %d times for rejected requests", n)
		}
		// Unprotected methods pass through without a key.
		if rr := send(h, "GET", "/pay", "", ""); rr.Code != 201 || calls.Load() != 1 {
			t.Fatalf("GET: %d, calls %d", rr.Code, calls.Load())
		}
		// A 255-character key is fine.
		if rr := send(h, "POST", "/pay", strings.Repeat("k", 255), `{}`); rr.Code != 201 {
			t.Fatalf("255-char key: %d %s", rr.Code, rr.Body)
		}
	})
}

func TestExecuteThenReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				h := e.wrap(t, &idemhttp.Config{Mode: mode}, effectHandler(t, e, 201, &calls))
				first := send(h, "POST", "/pay?label=a", "key-1", `{"amount":"10.00","to":"bob"}`)
				if first.Code != 201 {
					t.Fatalf("first: %d %s", first.Code, first.Body)
				}
				if first.Header().Get(idemhttp.ReplayedHeader) != "" {
					t.Fatal("first execution marked as replay")
				}
				if first.Header().Get("X-Not-Replayed") != "1" || first.Header().Get("Set-Cookie") == "" {
					t.Fatal("first execution must pass every header through")
				}
				// Same JSON with other key order and whitespace: a replay.
				for _, b := range []string{`{"amount":"10.00","to":"bob"}`, "{ \"to\" : \"bob\",\n \"amount\":\"10.00\" }"} {
					again := send(h, "POST", "/pay?label=a", "key-1", b)
					if again.Code != 201 || again.Body.String() != first.Body.String() {
						t.Fatalf("replay: %d %q, want 201 %q", again.Code, again.Body, first.Body)
					}
					if again.Header().Get(idemhttp.ReplayedHeader) != "true" {
						t.Fatal("replay not marked Idempotent-Replayed: true")
					}
					if again.Header().Get("Content-Type") != "application/json" || again.Header().Get("Location") != "/things/a" {
						t.Fatalf("replayed headers: %v", again.Header())
					}
					if again.Header().Get("Set-Cookie") != "" || again.Header().Get("X-Not-Replayed") != "" {
						t.Fatalf("replay leaked non-allow-listed headers: %v", again.Header())
					}
				}
				if n := e.effects(t, "a"); n != 1 || calls.Load() != 1 {
					t.Fatalf("effects = %d, calls = %d, want 1", n, calls.Load())
				}
			})
		})
	}
}

func TestKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, nil, effectHandler(t, e, 201, &calls))
		if rr := send(h, "POST", "/pay", "k", `{"amount":"10.00"}`); rr.Code != 201 {
			t.Fatal(rr.Code)
		}
		checkProblem(t, send(h, "POST", "/pay", "k", `{"amount":"11.00"}`), 409, problem.TypeKeyReused)
		// Same key on another target of the same route: also a mismatch.
		checkProblem(t, send(h, "POST", "/pay?label=other", "k", `{"amount":"10.00"}`), 409, problem.TypeKeyReused)
		h422 := e.wrap(t, &idemhttp.Config{MismatchStatus: 422}, effectHandler(t, e, 201, &calls))
		checkProblem(t, send(h422, "POST", "/pay", "k", `{"amount":"12.00"}`), 422, problem.TypeKeyReused)
		if calls.Load() != 1 {
			t.Fatalf("calls = %d, want 1", calls.Load())
		}
	})
}

func TestScopePerPrincipal(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, nil, effectHandler(t, e, 201, &calls))
		alice := send(h, "POST", "/pay?label=p", "shared-key", `{}`, "Authorization", "Bearer alice")
		bob := send(h, "POST", "/pay?label=p", "shared-key", `{}`, "Authorization", "Bearer bob")
		if alice.Code != 201 || bob.Code != 201 || alice.Body.String() == bob.Body.String() {
			t.Fatalf("alice %d %s, bob %d %s: want two executions", alice.Code, alice.Body, bob.Code, bob.Body)
		}
		if bob.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatal("bob got alice's stored response")
		}
		aliceAgain := send(h, "POST", "/pay?label=p", "shared-key", `{}`, "Authorization", "Bearer alice")
		bobAgain := send(h, "POST", "/pay?label=p", "shared-key", `{}`, "Authorization", "Bearer bob")
		if aliceAgain.Body.String() != alice.Body.String() || bobAgain.Body.String() != bob.Body.String() {
			t.Fatal("a principal's replay returned another principal's response")
		}
		if n := e.effects(t, "p"); n != 2 {
			t.Fatalf("effects = %d, want 2", n)
		}
		// A scope hook error is 401 and nothing runs.
		h401 := e.wrap(t, &idemhttp.Config{Scope: func(*http.Request) (string, error) {
			return "", errUnauthenticated
		}}, effectHandler(t, e, 201, &calls))
		checkProblem(t, send(h401, "POST", "/pay", "k", `{}`), 401, problem.TypeUnauthenticated)
	})
}

type constErr string

func (e constErr) Error() string { return string(e) }

const errUnauthenticated = constErr("no principal")

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{MaxBodyBytes: 16}, effectHandler(t, e, 201, &calls))
		checkProblem(t, send(h, "POST", "/pay", "k", strings.Repeat("x", 17)), 413, problem.TypeBodyTooLarge)
		if rr := send(h, "POST", "/pay", "k", strings.Repeat("x", 16)); rr.Code != 201 {
			t.Fatalf("16 bytes: %d", rr.Code)
		}
	})
}

func TestOutcomePolicy(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, e *env) {
				cfg := &idemhttp.Config{Mode: mode}
				cases := []struct {
					status int
					stored bool
				}{{200, true}, {201, true}, {400, true}, {404, true}, {422, true}, {429, false}, {500, false}, {503, false}}
				for _, c := range cases {
					var calls atomic.Int64
					label := "s" + strconv.Itoa(c.status)
					h := e.wrap(t, cfg, effectHandler(t, e, c.status, &calls))
					target := "/pay?label=" + label
					first := send(h, "POST", target, "k"+label, `{}`)
					second := send(h, "POST", target, "k"+label, `{}`)
					if first.Code != c.status || second.Code != c.status {
						t.Fatalf("%d: got %d then %d", c.status, first.Code, second.Code)
					}
					wantCalls := int64(2)
					if c.stored {
						wantCalls = 1
						if second.Body.String() != first.Body.String() || second.Header().Get(idemhttp.ReplayedHeader) != "true" {
							t.Fatalf("%d not replayed: %s vs %s", c.status, first.Body, second.Body)
						}
					}
					if calls.Load() != wantCalls {
						t.Fatalf("%d: handler ran %d times, want %d", c.status, calls.Load(), wantCalls)
					}
					// ModeTx rolls back the writes of an outcome it does not store.
					if mode == idemhttp.ModeTx {
						want := 1
						if !c.stored {
							want = 0
						}
						if n := e.effects(t, label); n != want {
							t.Fatalf("%d: effects = %d, want %d", c.status, n, want)
						}
					}
				}
			})
		})
	}
}

func TestPanicReleasesKey(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				boom := true
				h := e.wrap(t, &idemhttp.Config{Mode: mode}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					if err := e.effect(r, "panic"); err != nil {
						t.Error(err)
					}
					if boom {
						panic("handler bug")
					}
					w.WriteHeader(201)
				}))
				func() {
					defer func() {
						if recover() == nil {
							t.Error("panic swallowed: the server must still see it")
						}
					}()
					send(h, "POST", "/pay", "k", `{}`)
				}()
				if mode == idemhttp.ModeTx && e.effects(t, "panic") != 0 {
					t.Fatal("panicked handler's write committed")
				}
				boom = false
				if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
					t.Fatalf("retry after panic: %d replayed=%q", rr.Code, rr.Header().Get(idemhttp.ReplayedHeader))
				}
				if calls.Load() != 2 {
					t.Fatalf("calls = %d, want 2", calls.Load())
				}
			})
		})
	}
}

func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	t.Run("tx", func(t *testing.T) {
		t.Parallel()
		forEach(t, func(t *testing.T, e *env) {
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{MaxResponseBytes: 10}, effectHandler(t, e, 201, &calls))
			rr := send(h, "POST", "/pay?label=big", "k", `{}`)
			checkProblem(t, rr, 500, problem.TypeResponseTooLarge)
			if v, ok := storedMember(t, rr); ok {
				t.Fatalf("stored member %v: the request fails again until the limit is raised", v)
			}
			if n := e.effects(t, "big"); n != 0 {
				t.Fatalf("effects = %d: a response that cannot be stored must roll back", n)
			}
		})
	})
	t.Run("lease", func(t *testing.T) {
		t.Parallel()
		forEach(t, func(t *testing.T, e *env) {
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeLease, MaxResponseBytes: 10}, effectHandler(t, e, 201, &calls))
			checkProblem(t, send(h, "POST", "/pay?label=big", "k", `{}`), 500, problem.TypeResponseTooLarge)
			// The external effect cannot be undone: the key stays taken and
			// retries get the same 500 instead of executing again.
			again := send(h, "POST", "/pay?label=big", "k", `{}`)
			checkProblem(t, again, 500, problem.TypeResponseTooLarge)
			if v, ok := storedMember(t, again); ok {
				t.Fatalf("stored member %v on a stored outcome: a client would retry it", v)
			}
			if calls.Load() != 1 || e.effects(t, "big") != 1 {
				t.Fatalf("calls = %d, effects = %d, want 1", calls.Load(), e.effects(t, "big"))
			}
		})
	})
}

func TestExpiredRecordIsAbsent(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		var now atomic.Int64
		now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
		clock := func() time.Time { return time.Unix(0, now.Load()) }
		h := e.wrap(t, &idemhttp.Config{Now: clock}, effectHandler(t, e, 201, &calls))
		send(h, "POST", "/pay?label=ttl", "k", `{}`)
		now.Add(int64(24*time.Hour - time.Second))
		if rr := send(h, "POST", "/pay?label=ttl", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatal("record expired before its TTL")
		}
		now.Add(int64(2 * time.Second))
		// Past the TTL the key is free again, even for another body.
		if rr := send(h, "POST", "/pay?label=ttl", "k", `{"new":1}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("expired record still deduplicates: %d", rr.Code)
		}
		if n := e.effects(t, "ttl"); n != 2 {
			t.Fatalf("effects = %d, want 2", n)
		}
	})
}

func TestStoreUnavailableFailsClosed(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				h := e.wrap(t, &idemhttp.Config{Mode: mode}, effectHandler(t, e, 201, &calls))
				e.closeStore()
				rr := send(h, "POST", "/pay", "k", `{}`)
				checkProblem(t, rr, 503, problem.TypeStoreUnavailable)
				if rr.Header().Get("Retry-After") == "" {
					t.Fatal("503 without Retry-After")
				}
				if calls.Load() != 0 {
					t.Fatal("handler ran without dedup")
				}
			})
		})
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	drv := testdbSQLite(t)
	bad := []idemhttp.Config{
		{TTL: time.Hour},
		{TTL: 73 * time.Hour},
		{TTL: -time.Hour, TTLOverrideReason: "x"},
		{MismatchStatus: 400},
		{Mode: 7},
		{Methods: []string{"post"}},
		{Methods: []string{"POST", " PATCH"}}, // from strings.Split("POST, PATCH", ",")
		{Methods: []string{"POST\x00"}},
		{Wait: 720 * time.Hour},
		{RetryAfter: time.Millisecond},
		{Lease: 10 * time.Millisecond},
		{Wait: -5 * time.Second},
		{MaxBodyBytes: -1},
		{CommitTimeout: -time.Second},
		{ReplayHeaders: []string{"content-length"}},
		{ReplayHeaders: []string{"X-Request-Id", "Transfer-Encoding"}},
		{ReplayHeaders: []string{idemhttp.ReplayedHeader}},
	}
	for _, c := range bad {
		if _, err := idemhttp.New(drv, &c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	good := []idemhttp.Config{
		{},
		{TTL: 72 * time.Hour},
		{TTL: time.Hour, TTLOverrideReason: "test environment"},
		{MismatchStatus: 422, Wait: idemhttp.NoWait, Mode: idemhttp.ModeLease},
		{Methods: []string{"POST", "PATCH", "M-SEARCH"}, Wait: time.Hour},
		{ReplayHeaders: []string{"X-Request-Id", "Set-Cookie"}},
		{CommitTimeout: time.Millisecond},
	}
	for _, c := range good {
		if _, err := idemhttp.New(drv, &c); err != nil {
			t.Errorf("config %+v rejected: %v", c, err)
		}
	}
}

// New warns when Config.Scope is not set (the default scopes by a hash of
// the Authorization header, which a token refresh changes), and not when
// it is.
func TestDefaultScopeWarned(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	for _, scope := range []func(*http.Request) (string, error){nil, func(*http.Request) (string, error) { return "c", nil }} {
		var logs bytes.Buffer
		if _, err := idemhttp.New(drv, &idemhttp.Config{Scope: scope, Logger: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatal(err)
		}
		if warned := strings.Contains(logs.String(), "Config.Scope not set"); warned != (scope == nil) {
			t.Fatalf("Scope set %v: warned %v; logs: %s", scope != nil, warned, logs.String())
		}
	}
}
