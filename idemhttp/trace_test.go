package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe/observetest"
	"github.com/idemkit/idem/problem"
)

// The middleware's spans: a request span with the outcome, and its claim,
// execute, replay and conflict children; never the key or the body.
func TestTracing(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			rec := &observetest.Recorder{}
			mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Mode: mode, Tracer: rec, ReplayCacheBytes: idemhttp.NoReplayCache})
			if err != nil {
				t.Fatal(err)
			}
			var handlerTrace observetest.SpanContext
			mux := http.NewServeMux()
			mux.Handle("POST /things", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handlerTrace, _ = observetest.FromContext(r.Context())
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"id":1}`))
			})))
			send := func(body string) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
				req.Header.Set("Idempotency-Key", "secret-key-1")
				rr := httptest.NewRecorder()
				mux.ServeHTTP(rr, req)
				return rr
			}
			if rr := send(`{"secret":"body"}`); rr.Code != http.StatusCreated {
				t.Fatalf("first: %d", rr.Code)
			}
			if rr := send(`{"secret":"body"}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("second: %d, not replayed", rr.Code)
			}
			if rr := send(`{"other":"body"}`); rr.Code != http.StatusConflict {
				t.Fatalf("third: %d", rr.Code)
			}

			reqs := rec.Named("idem.http.request")
			if len(reqs) != 3 {
				t.Fatalf("%d request spans, want 3", len(reqs))
			}
			for i, want := range []string{"executed", "replayed", "mismatch"} {
				s := reqs[i]
				if !s.Ended() || s.Attr("idem.outcome") != want || s.Attr("idem.replayed") != (want == "replayed") || s.Attr("http.route") != "/things" {
					t.Errorf("request %d: outcome %v replayed %v route %v ended %v", i, s.Attr("idem.outcome"), s.Attr("idem.replayed"), s.Attr("http.route"), s.Ended())
				}
			}
			exec := rec.Named("idem.http.execute")
			if len(exec) != 1 || exec[0].Parent != reqs[0].SpanContext || handlerTrace != exec[0].SpanContext {
				t.Errorf("execute spans %v; want one child of the first request, the handler's context", exec)
			}
			// One claim per request, or more on SQLite when a claim finds
			// the database busy and claims again: the first request's
			// last claim claimed the key, the replay's did not.
			for i, want := range []any{true, false, false} {
				var last *observetest.Span
				for _, c := range rec.Named("idem.http.claim") {
					if c.Parent == reqs[i].SpanContext {
						last = c
					}
				}
				if last == nil || last.Attr("idem.claimed") != want {
					t.Errorf("request %d: last claim span %v; want one with idem.claimed %v", i, last, want)
				}
			}
			if rp := rec.Named("idem.http.replay"); len(rp) != 1 || rp[0].Parent != reqs[1].SpanContext {
				t.Errorf("replay spans %v", rp)
			}
			if c := rec.Named("idem.http.conflict"); len(c) != 1 || c[0].Parent != reqs[2].SpanContext || c[0].Attr("idem.conflict") != "mismatch" {
				t.Errorf("conflict spans %v", c)
			}
			for _, s := range rec.Spans() {
				for _, k := range []string{"http.route", "idem.outcome", "idem.conflict", "http.request.method"} {
					if v, _ := s.Attr(k).(string); strings.Contains(v, "secret") {
						t.Errorf("span %s attribute %s = %q", s.Name, k, v)
					}
				}
			}
		})
	}
}

// A request no ServeMux routed has no http.route on its span: DefaultRoute
// would give its URL path, one value per resource, where the attribute must
// be a template. A Config.Route of the user's is used as it is.
func TestTracingRouteWithoutPattern(t *testing.T) {
	t.Parallel()
	for _, route := range []func(*http.Request) string{nil, idemhttp.DefaultRoute, func(*http.Request) string { return "POST /orders/{id}" }} {
		rec := &observetest.Recorder{}
		mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Tracer: rec, Route: route})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
		req := httptest.NewRequest(http.MethodPost, "/orders/81", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
		reqs := rec.Named("idem.http.request")
		if len(reqs) != 1 {
			t.Fatalf("%d request spans, want 1", len(reqs))
		}
		want := any(nil)
		if route != nil && reflect.ValueOf(route).Pointer() != reflect.ValueOf(idemhttp.DefaultRoute).Pointer() {
			want = "POST /orders/{id}"
		}
		if got := reqs[0].Attr("http.route"); got != want {
			t.Errorf("http.route = %v, want %v", got, want)
		}
	}
}

// A handler that panics: the panic goes on, and the request span and its
// idem.http.execute child are ended with the panic as their error, not as
// a request that went well.
func TestTracingHandlerPanic(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			rec := &observetest.Recorder{}
			mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Mode: mode, Tracer: rec})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
			req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "k1")
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Errorf("recovered %v; want the handler's panic", r)
					}
				}()
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			for _, name := range []string{"idem.http.request", "idem.http.execute"} {
				spans := rec.Named(name)
				if len(spans) != 1 {
					t.Fatalf("%d %s spans; want 1", len(spans), name)
				}
				if s := spans[0]; !s.Ended() || s.Err() == nil || !strings.Contains(s.Err().Error(), "boom") {
					t.Errorf("%s: ended %v, error %v; want ended with the panic", name, s.Ended(), s.Err())
				}
			}
		})
	}
}

// A ServeMux pattern gives http.route its path template alone: the method
// is http.request.method's, and a host is not part of a route.
func TestTracingRouteFromPattern(t *testing.T) {
	t.Parallel()
	for pattern, want := range map[string]string{
		"POST /orders/{id}":            "/orders/{id}",
		"POST example.com/orders/{id}": "/orders/{id}",
		"/orders/{id}":                 "/orders/{id}",
		"example.com/orders/{id...}":   "/orders/{id...}",
	} {
		rec := &observetest.Recorder{}
		mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Tracer: rec})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(pattern, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })))
		req := httptest.NewRequest(http.MethodPost, "http://example.com/orders/81", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		rr := httptest.NewRecorder()
		mux.ServeHTTP(rr, req)
		if rr.Code != http.StatusCreated {
			t.Fatalf("%q: status %d", pattern, rr.Code)
		}
		reqs := rec.Named("idem.http.request")
		if len(reqs) != 1 {
			t.Fatalf("%q: %d request spans, want 1", pattern, len(reqs))
		}
		if got := reqs[0].Attr("http.route"); got != want {
			t.Errorf("%q: http.route = %v, want %q", pattern, got, want)
		}
	}
}

// A request the middleware answers with a failure of its store or of the
// command's transaction ends its spans failed, with the error: the request
// span, and the execute span when the failure came after the handler ran.
// Before, only the claim span of a failed claim said so: a request
// answered 503 because its connection broke before COMMIT, or 500 because
// its transaction was aborted, showed in a trace backend as a request
// that went well (idem.outcome aside).
func TestTracingStoreFailures(t *testing.T) {
	t.Parallel()
	// The store is closed before the claim: 503 store-unavailable.
	t.Run("claim", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			t.Run(mode.String(), func(t *testing.T) {
				t.Parallel()
				forEach(t, func(t *testing.T, e *env) {
					rec := &observetest.Recorder{}
					var calls atomic.Int64
					h := e.wrap(t, &idemhttp.Config{Mode: mode, Tracer: rec, Logger: slog.New(slog.DiscardHandler)}, effectHandler(t, e, 201, &calls))
					e.closeStore()
					if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != http.StatusServiceUnavailable {
						t.Fatalf("status %d, want 503", rr.Code)
					}
					// A claim span when the claim failed (not when the
					// Begin before it did), ended failed.
					checkFailedSpans(t, rec, "store_error", "idem.http.request")
					for _, s := range rec.Named("idem.http.claim") {
						if s.Err() == nil {
							t.Error("claim span without the store's error")
						}
					}
				})
			})
		}
	})
	// The request's deadline has passed before its claim: 503 (a
	// server-side timeout, not a client gone, which is no server error).
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			rec := &observetest.Recorder{}
			mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Mode: mode, Tracer: rec, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`)).WithContext(ctx)
			req.Header.Set("Idempotency-Key", "k")
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			cancel()
			if rr.Code != http.StatusServiceUnavailable {
				t.Fatalf("%s: status %d, want 503", mode, rr.Code)
			}
			checkFailedSpans(t, rec, "store_error", "idem.http.request")
		}
	})
	// The handler's connection is killed before COMMIT: 503.
	t.Run("commit", func(t *testing.T) {
		t.Parallel()
		for _, b := range backendList {
			if !strings.HasPrefix(b.name, "postgres") {
				continue
			}
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				e := b.mk(t)
				rec := &observetest.Recorder{}
				h := e.wrap(t, &idemhttp.Config{Tracer: rec, Logger: slog.New(slog.DiscardHandler)}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if err := e.effect(r, "killed"); err != nil {
						t.Error(err)
					}
					if err := e.kill(r); err != nil {
						t.Error(err)
					}
					w.WriteHeader(http.StatusCreated)
				}))
				if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != http.StatusServiceUnavailable {
					t.Fatalf("status %d, want 503", rr.Code)
				}
				checkFailedSpans(t, rec, "store_error", "idem.http.request", "idem.http.execute")
			})
		}
	})
	// A statement of the handler aborts the transaction: 500
	// transaction-aborted.
	t.Run("aborted", func(t *testing.T) {
		t.Parallel()
		for _, b := range backendList {
			if !strings.HasPrefix(b.name, "postgres") {
				continue
			}
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				e := b.mk(t)
				e.exec(t, `CREATE TABLE uq (v TEXT PRIMARY KEY)`)
				e.exec(t, `INSERT INTO uq (v) VALUES ('taken')`)
				rec := &observetest.Recorder{}
				h := e.wrap(t, &idemhttp.Config{Tracer: rec, Logger: slog.New(slog.DiscardHandler)}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_ = e.txExec(r, `INSERT INTO uq (v) VALUES ('taken')`)
					w.WriteHeader(http.StatusConflict)
				}))
				checkProblem(t, send(h, "POST", "/pay", "k", `{}`), http.StatusInternalServerError, problem.TypeTransactionAborted)
				checkFailedSpans(t, rec, "not_stored", "idem.http.request", "idem.http.execute")
			})
		}
	})
}

// A handler's 5xx, passed on and not stored, ends the request and execute
// spans failed, as HTTP's semantic conventions count a server's 5xx; a 4xx
// not stored (429) does not.
func TestTracingHandlerServerError(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
				rec := &observetest.Recorder{}
				mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Mode: mode, Tracer: rec})
				if err != nil {
					t.Fatal(err)
				}
				h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
				if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != status {
					t.Fatalf("status %d, want %d", rr.Code, status)
				}
				for _, name := range []string{"idem.http.request", "idem.http.execute"} {
					spans := rec.Named(name)
					if len(spans) != 1 || !spans[0].Ended() {
						t.Fatalf("%s spans %v; want one, ended", name, spans)
					}
					if failed := spans[0].Err() != nil; failed != (status >= 500) {
						t.Errorf("handler answered %d: %s span error %v", status, name, spans[0].Err())
					}
				}
			}
		})
	}
}

// checkFailedSpans checks that rec holds one request span, with outcome,
// and that each span named in failed is ended with an error.
func checkFailedSpans(t *testing.T, rec *observetest.Recorder, outcome string, failed ...string) {
	t.Helper()
	if reqs := rec.Named("idem.http.request"); len(reqs) != 1 || reqs[0].Attr("idem.outcome") != outcome {
		t.Fatalf("request spans %v; want one with outcome %s", reqs, outcome)
	}
	for _, name := range failed {
		spans := rec.Named(name)
		if len(spans) == 0 {
			t.Errorf("no %s span", name)
		}
		for _, s := range spans {
			if !s.Ended() || s.Err() == nil {
				t.Errorf("%s span: ended %v, error %v; want ended with the store's error", name, s.Ended(), s.Err())
			}
		}
	}
	for _, s := range rec.Spans() {
		if !s.Ended() {
			t.Errorf("%s span not ended", s.Name)
		}
	}
}
