package app_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/observe/observetest"
)

// With telemetry on, each request is one server span, and its log lines
// carry its trace_id and span_id: an operator goes from the access log
// line to the trace. The server span continues the caller's traceparent
// (or starts a trace), and the middleware's idem.http.request is its
// child.
func TestRequestLogCarriesTrace(t *testing.T) {
	t.Parallel()
	logs := &testlog.Buffer{}
	cfg, err := app.ParseConfig([]string{"-db", testdb.SQLitePath(t), "-kafka", "off", "-cleanup", "off"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	rec := &observetest.Recorder{}
	a, err := app.New(context.Background(), cfg, slog.New(slog.NewJSONHandler(logs, nil)),
		app.WithTelemetry(&app.Telemetry{Tracer: rec, Propagator: observetest.Propagator{}}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() { srv.Close(); a.Close() })

	const (
		callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan  = "00f067aa0ba902b7"
	)
	post := func(key, traceparent string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders",
			strings.NewReader(`{"customer_id":42,"amount":"1.00","items":[{"sku":"A-1","quantity":1}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer t")
		req.Header.Set("Idempotency-Key", key)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("POST /v1/orders: %d", res.StatusCode)
		}
	}
	type line struct {
		Msg            string
		TraceID        string `json:"trace_id"`
		SpanID         string `json:"span_id"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	requestLine := func(key string) line {
		t.Helper()
		for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
			var v line
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			if v.Msg == "request" && v.IdempotencyKey == key {
				return v
			}
		}
		t.Fatalf("no request line for key %s:\n%s", key, logs)
		return line{}
	}

	// With the caller's traceparent: its trace.
	post("trace-1", "00-"+callerTrace+"-"+callerSpan+"-01")
	got := requestLine("trace-1")
	if got.TraceID != callerTrace {
		t.Errorf("request line trace_id %q; want the caller's %s:\n%s", got.TraceID, callerTrace, logs)
	}
	servers := rec.Named("POST /v1/orders")
	requests := rec.Named("idem.http.request")
	if len(servers) != 1 || len(requests) != 1 {
		t.Fatalf("%d server spans, %d idem.http.request spans; want 1 each", len(servers), len(requests))
	}
	server := servers[0]
	if server.Parent.SpanID != callerSpan || server.TraceID != callerTrace {
		t.Errorf("server span %+v; want a child of the caller's span %s", server.SpanContext, callerSpan)
	}
	if got.SpanID != server.SpanID {
		t.Errorf("request line span_id %q; want the server span's %s", got.SpanID, server.SpanID)
	}
	if requests[0].Parent != server.SpanContext {
		t.Errorf("idem.http.request parent %+v; want the server span %+v", requests[0].Parent, server.SpanContext)
	}
	for k, want := range map[string]any{"http.request.method": "POST", "http.route": "/v1/orders", "http.response.status_code": int64(201)} {
		if v := server.Attr(k); v != want {
			t.Errorf("server span attribute %s = %v (%T); want %v", k, v, v, want)
		}
	}
	if !server.Ended() || server.Err() != nil {
		t.Errorf("server span ended %v, error %v; want ended without error", server.Ended(), server.Err())
	}

	// Without one: the trace the request started, that of its
	// idem.http.request span.
	post("trace-2", "")
	got = requestLine("trace-2")
	requests = rec.Named("idem.http.request")
	if len(requests) != 2 {
		t.Fatalf("%d idem.http.request spans; want 2", len(requests))
	}
	if got.TraceID == "" || got.TraceID != requests[1].TraceID || got.TraceID == callerTrace {
		t.Errorf("request line trace_id %q; want that of its idem.http.request span, %s", got.TraceID, requests[1].TraceID)
	}
}
