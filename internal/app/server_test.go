package app_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRoutingErrorsAreProblems(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		tests := []struct {
			method, path string
			status       int
			allow        string
		}{
			{http.MethodGet, "/", 404, ""},
			{http.MethodGet, "/v2/payments", 404, ""},
			{http.MethodDelete, "/v1/payments", 405, "POST"},
			{http.MethodGet, "/v1/payments", 405, "POST"},
			{http.MethodPut, "/v1/payments/1", 405, "GET, HEAD"},
			{http.MethodPost, "/healthz", 405, "GET, HEAD"},
		}
		for _, tt := range tests {
			r := e.do(tt.method, tt.path, nil, "")
			if r.status != tt.status || r.header.Get("Allow") != tt.allow {
				t.Errorf("%s %s: %d Allow %q, want %d Allow %q", tt.method, tt.path, r.status, r.header.Get("Allow"), tt.status, tt.allow)
			}
			if typ := r.problemType(t); typ != "about:blank" {
				t.Errorf("%s %s: type %q", tt.method, tt.path, typ)
			}
		}
	})
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		r := e.do(http.MethodGet, "/healthz", nil, "")
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"status":"ok"}` {
			t.Errorf("healthz: %d %s", r.status, r.body)
		}
		e.app.Close() // the database goes away
		r = e.do(http.MethodGet, "/healthz", nil, "")
		if r.status != http.StatusServiceUnavailable {
			t.Errorf("healthz without database: %d %s, want 503", r.status, r.body)
		}
		r.problemType(t)
		// A liveness probe must not restart a replica for its database's
		// outage (every replica would restart at once, and again).
		r = e.do(http.MethodGet, "/livez", nil, "")
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"status":"ok"}` {
			t.Errorf("livez without database: %d %s, want 200 ok", r.status, r.body)
		}
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		e.post("key-1", paymentBody("ext-1"))
		e.post("key-1", paymentBody("ext-1"))
		e.post("key-1", paymentBody("ext-2"))
		e.post("", paymentBody("ext-3"))
		r := e.do(http.MethodGet, "/metrics", nil, "")
		if r.status != http.StatusOK {
			t.Fatalf("metrics: %d", r.status)
		}
		for _, want := range []string{
			`idemd_http_outcomes_total{outcome="executed"} 1`,
			`idemd_http_outcomes_total{outcome="replayed"} 1`,
			`idemd_http_outcomes_total{outcome="mismatch"} 1`,
			`idemd_http_outcomes_total{outcome="rejected"} 1`,
			`idemd_http_outcomes_total{outcome="store_error"} 0`,
			`idemd_http_requests_total{route="POST /v1/payments",status="201"} 2`,
			`idemd_http_requests_total{route="POST /v1/payments",status="409"} 1`,
			`idemd_http_requests_total{route="POST /v1/payments",status="400"} 1`,
			`idemd_http_request_duration_seconds_count{route="POST /v1/payments"} 4`,
			// The replay and the mismatch are answered from memory.
			`idemd_http_replay_cache_hits_total{endpoint="payments"} 2`,
			`idemd_http_replay_cache_entries{endpoint="payments"} 1`,
			`idemd_http_replay_cache_entries{endpoint="orders"} 0`,
			`idemd_http_replay_cache_evictions_total{endpoint="payments"} 0`,
			`idemd_http_replay_cache_max_bytes{endpoint="payments"} 3.3554432e+07`,
		} {
			if !strings.Contains(string(r.body), want+"\n") {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}

func TestAccessLog(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, e *env) {
		e.post("key-1", paymentBody("ext-1"))
		e.post("key-1", paymentBody("ext-1"))
		e.do(http.MethodGet, "/nope", nil, "")
		type line struct {
			Msg        string
			Method     string
			Path       string
			Route      string
			Status     int
			Replayed   bool
			DurationMS *float64 `json:"duration_ms"`
			// The request's Idempotency-Key: what an operator looks
			// up the idempotency record and the other lines by.
			Key string `json:"idempotency_key"`
		}
		var lines []line
		deadline := time.Now().Add(5 * time.Second)
		for { // the server logs after the client has its response
			lines = lines[:0]
			for _, s := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
				var l line
				if err := json.Unmarshal([]byte(s), &l); err != nil {
					t.Fatalf("log line %q is not JSON: %v", s, err)
				}
				if l.Msg == "request" {
					lines = append(lines, l)
				}
			}
			if len(lines) >= 3 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(lines) != 3 {
			t.Fatalf("%d access log lines, want 3:\n%s", len(lines), e.logs.String())
		}
		want := []line{
			{Method: "POST", Path: "/v1/payments", Route: "POST /v1/payments", Status: 201, Replayed: false, Key: "key-1"},
			{Method: "POST", Path: "/v1/payments", Route: "POST /v1/payments", Status: 201, Replayed: true, Key: "key-1"},
			{Method: "GET", Path: "/nope", Route: "unmatched", Status: 404},
		}
		for i, w := range want {
			got := lines[i]
			if got.DurationMS == nil {
				t.Errorf("line %d has no duration_ms", i)
			}
			got.Msg, got.DurationMS = "", nil
			if got != w {
				t.Errorf("line %d = %+v, want %+v", i, got, w)
			}
		}
	})
}
