package app

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/observe/observetest"
)

// A handler that panics is logged and counted. Before its response
// started, the client gets a 500 problem; after, its connection is cut
// (as net/http does), so that a truncated body never reaches the client
// as a complete response.
func TestHandlerPanic(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	a := &App{log: slog.New(slog.NewJSONHandler(logs, nil)), metrics: newMetrics()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /early", func(http.ResponseWriter, *http.Request) { panic("early") })
	mux.HandleFunc("GET /late", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"items":[1,2,`)
		panic("late")
	})
	srv := httptest.NewServer(a.observe(mux))
	srv.Config.ErrorLog = slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)
	t.Cleanup(srv.Close)

	res, err := srv.Client().Get(srv.URL + "/early")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusInternalServerError || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("panic before the response: %d %s, want a 500 problem", res.StatusCode, res.Header.Get("Content-Type"))
	}

	res, err = srv.Client().Get(srv.URL + "/late")
	if err == nil {
		body, rerr := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if rerr == nil {
			t.Errorf("panic in the middle of the response: the client got %d %q as a complete response; want the connection cut", res.StatusCode, body)
		}
	} else if !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "EOF") {
		t.Logf("client error: %v", err)
	}
	if n := strings.Count(logs.String(), `"msg":"handler panic"`); n != 2 {
		t.Errorf("%d handler panic lines, want 2:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), `"msg":"request"`); n != 2 {
		t.Errorf("%d access log lines, want 2:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "trace_id") {
		t.Errorf("untraced, a line carries a trace_id:\n%s", logs)
	}
	// Both count as the server errors they are (the 5xx ratio alert covers
	// panics), the one whose response had started too: its client got no
	// complete response, whatever status went out before the cut.
	for _, route := range []string{"GET /early", "GET /late"} {
		if got := testutil.ToFloat64(a.metrics.requests.WithLabelValues(route, "500")); got != 1 {
			t.Errorf(`idemd_http_requests_total{route=%q,status="500"} = %v, want 1`, route, got)
		}
	}
	if !strings.Contains(logs.String(), `"path":"/late","route":"GET /late","status":500,`) || !strings.Contains(logs.String(), `"cut":true`) {
		t.Errorf("the cut response's access line does not say 500, cut:\n%s", logs)
	}
	// The line is what an operator reports (docs/operations.md): it
	// carries the goroutine's stack, down to the handler that panicked.
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var line struct {
			Msg, Panic, Stack string
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if line.Msg == "handler panic" && !strings.Contains(line.Stack, "TestHandlerPanic.func") {
			t.Errorf("handler panic %q logged with the stack %q; want the handler's frames", line.Panic, line.Stack)
		}
	}
}

// A panic under the idempotency middleware, which undoes the claim and
// panics on with it, is logged with the handler's frames too.
func TestHandlerPanicStackThroughMiddleware(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	a := &App{log: slog.New(slog.NewJSONHandler(logs, nil)), metrics: newMetrics()}
	mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "p", nil }, OnOutcome: a.metrics.outcome})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })))
	rr := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.KeyHeader, "k")
	a.observe(mux).ServeHTTP(rr, req)
	if rr.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rr.Code)
	}
	var line struct{ Msg, Stack string }
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if err := json.Unmarshal([]byte(l), &line); err == nil && line.Msg == "handler panic" {
			break
		}
	}
	if line.Msg != "handler panic" || !strings.Contains(line.Stack, "TestHandlerPanicStackThroughMiddleware.func") {
		t.Errorf("handler panic line %q with the stack %q; want the handler's frames:\n%s", line.Msg, line.Stack, logs)
	}
	if got := testutil.ToFloat64(a.metrics.outcomes.WithLabelValues("not_stored")); got != 1 {
		t.Errorf(`idemd_http_outcomes_total{outcome="not_stored"} = %v, want 1`, got)
	}
}

// Traced, a panic is a failed server span, and its "handler panic" and
// "request" lines carry the span's IDs; so does a 5xx. A request that no
// route matches is a span named after its method alone.
func TestServerSpan(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	rec := &observetest.Recorder{}
	a := &App{metrics: newMetrics(), tracer: rec, propagator: observetest.Propagator{}}
	a.log = withTraceIDs(slog.New(slog.NewJSONHandler(logs, nil)), a.propagator)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /panic", func(http.ResponseWriter, *http.Request) { panic("early") })
	mux.HandleFunc("GET /fail/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	mux.HandleFunc("GET /abort", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
	h := a.observe(problemRouting(mux))
	for _, path := range []string{"/panic", "/fail/7", "/nowhere"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, http.ErrAbortHandler) {
				t.Errorf("GET /abort panicked with %v; want http.ErrAbortHandler, as net/http expects", err)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/abort", nil))
	}()
	spans := rec.Spans()
	if len(spans) != 4 {
		t.Fatalf("%d spans; want 4", len(spans))
	}
	// An aborted handler (http.ErrAbortHandler) is not logged, but its
	// span ends, failed.
	if s := spans[3]; s.Name != "GET /abort" || !s.Ended() || s.Err() == nil || s.Attr("http.response.status_code") != nil {
		t.Errorf("aborted request's span %s ended %v error %v status %v; want GET /abort ended failed, without a status",
			s.Name, s.Ended(), s.Err(), s.Attr("http.response.status_code"))
	}
	for i, want := range []struct {
		name, route string
		status      int64
		failed      bool
	}{
		{"GET /panic", "/panic", 500, true},
		{"GET /fail/{id}", "/fail/{id}", 502, true},
		{"GET", "", 404, false},
	} {
		s := spans[i]
		route, _ := s.Attr("http.route").(string)
		if s.Name != want.name || route != want.route || s.Attr("http.response.status_code") != want.status ||
			(s.Err() != nil) != want.failed || !s.Ended() {
			t.Errorf("span %d: %s route %q status %v error %v ended %v; want %+v", i, s.Name, route,
				s.Attr("http.response.status_code"), s.Err(), s.Ended(), want)
		}
	}
	var lines int
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var line struct {
			Msg     string
			Path    string
			TraceID string `json:"trace_id"`
			SpanID  string `json:"span_id"`
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		want := spans[0]
		switch line.Path {
		case "/fail/7":
			want = spans[1]
		case "/nowhere":
			want = spans[2]
		}
		lines++
		if line.TraceID != want.TraceID || line.SpanID != want.SpanID {
			t.Errorf("%s line of %s: trace_id %q span_id %q; want %s %s", line.Msg, line.Path, line.TraceID, line.SpanID, want.TraceID, want.SpanID)
		}
	}
	if lines != 4 { // the panic's two lines, one per other request
		t.Errorf("%d log lines; want 4:\n%s", lines, logs)
	}
}
