package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe/observetest"
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
			if claims := rec.Named("idem.http.claim"); len(claims) != 3 || claims[0].Attr("idem.claimed") != true || claims[1].Attr("idem.claimed") != false {
				t.Errorf("claim spans: %d", len(claims))
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
