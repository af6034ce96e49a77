package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
)

// TestStorePolicyPanicReleasesKey: Config.Store runs after the handler
// returned, with the ModeTx transaction still open. A policy that panics
// must undo like a handler that panics: the transaction rolled back, the
// key (and, on SQLite, the database's only writer) free for the retry,
// which executes. It used to leak the transaction: every retry of the key
// answered 409 in progress (PostgreSQL) or waited for a connection that
// never came (SQLite), until the process restarted.
func TestStorePolicyPanicReleasesKey(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		var boom atomic.Bool
		boom.Store(true)
		cfg := &idemhttp.Config{Wait: 300 * time.Millisecond, Store: func(status int) bool {
			if boom.Load() {
				panic("store policy bug")
			}
			return idemhttp.DefaultStore(status)
		}}
		h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := e.effect(r, "policy"); err != nil {
				t.Error(err)
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
		boom.Store(false)
		// Bounded, so that a leaked transaction fails the test instead of
		// hanging it.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		if rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("retry after the policy panicked: %d %s, want a new execution", rr.Code, rr.Body)
		}
		if n := calls.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
		if n := e.effects(t, "policy"); n != 1 {
			t.Fatalf("%d effects, want 1 (the first rolled back)", n)
		}
	})
}
