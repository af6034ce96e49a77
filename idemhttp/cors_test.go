package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// The checkout of a single-page app on https://shop.example (and its
// mobile site) calls the API cross-origin with fetch(): the Idempotency-Key
// header, not CORS-safelisted, makes the browser send a preflight OPTIONS
// first, and the app reads Idempotent-Replayed, Retry-After and the
// problem+json body only when the answer carries its Origin in
// Access-Control-Allow-Origin and exposes those headers.
var corsOrigins = []string{"https://shop.example", "https://m.shop.example"}

// corsMiddleware is a CORS middleware as the common libraries write one
// (github.com/rs/cors): it answers a preflight itself, and sets the
// headers of an actual request from an allowed origin before calling next.
func corsMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		origin := r.Header.Get("Origin")
		allowed := slices.Contains(corsOrigins, origin)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
			if allowed {
				h.Set("Access-Control-Allow-Origin", origin)
				h.Set("Access-Control-Allow-Credentials", "true")
				h.Set("Access-Control-Allow-Methods", "POST")
				h.Set("Access-Control-Allow-Headers", "Content-Type, Idempotency-Key, Authorization")
				h.Set("Access-Control-Max-Age", "600")
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Add("Vary", "Origin")
		if allowed {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Set("Access-Control-Expose-Headers", "Idempotent-Replayed, Retry-After, Location")
		}
		next.ServeHTTP(w, r)
	})
}

// A CORS middleware inside the idempotency middleware sets the
// Access-Control headers on the handler's response: listed in
// ReplayHeaders, the first request's are stored and replayed to a retry
// from another origin, whose browser then refuses the answer (its Origin
// is not the one allowed), and the app never learns that its payment was
// made. New refuses them: they belong to each request, and the CORS
// middleware goes outside.
func TestReplayHeadersRefuseCORSHeaders(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Access-Control-Allow-Origin", "access-control-allow-credentials", "Access-Control-Expose-Headers"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			drv := testdbSQLite(t)
			cfg := &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u1", nil }, ReplayHeaders: []string{name}}
			mw, err := idemhttp.New(drv, cfg)
			if err != nil {
				if !strings.Contains(err.Error(), "CORS") {
					t.Fatalf("refused without saying why: %v", err)
				}
				return
			}
			// What the accepted configuration does: origin B's retry
			// gets origin A's answer.
			h := mw.Handler(corsMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			})))
			send(h, "POST", "/pay", "k", `{}`, "Origin", corsOrigins[0])
			rr := send(h, "POST", "/pay", "k", `{}`, "Origin", corsOrigins[1])
			t.Fatalf("ReplayHeaders %q accepted: the retry from %s was answered Access-Control-Allow-Origin %q, Access-Control-Allow-Credentials %q, Access-Control-Expose-Headers %q",
				name, corsOrigins[1], rr.Header().Get("Access-Control-Allow-Origin"), rr.Header().Get("Access-Control-Allow-Credentials"), rr.Header().Get("Access-Control-Expose-Headers"))
		})
	}
}

// The CORS middleware outside the idempotency middleware (and the mux), as
// the package documentation says: the preflight passes untouched, a retry
// from another allowed origin gets the stored answer with its own
// origin's headers, nothing of the first request (its cookie, its request
// ID) is replayed, and the middleware's own answers are readable.
func TestCORSOutsideMiddleware(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		holding := make(chan struct{})
		var once sync.Once
		mux := http.NewServeMux()
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := calls.Add(1)
			if r.URL.Path == "/slow" {
				once.Do(func() { close(holding) })
				<-r.Context().Done() // until its duplicate was answered
				return
			}
			if err := e.effect(r, "cors"); err != nil {
				t.Errorf("effect: %v", err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/pay/1")
			w.Header().Set("Set-Cookie", "sid=first")
			w.Header().Set("X-Request-Id", "req-first")
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"n":%d}`, n)
		})
		cfg := idemhttp.Config{
			Scope:        func(*http.Request) (string, error) { return "u1", nil },
			MaxBodyBytes: 64,
			Wait:         idemhttp.NoWait,
		}
		mux.Handle("POST /pay", e.wrap(t, &cfg, handler))
		// ModeLease: the first request holds the key, not a connection,
		// while it runs (as a call to a payment provider would).
		lease := cfg
		lease.Mode = idemhttp.ModeLease
		mux.Handle("POST /slow", e.wrap(t, &lease, handler))
		api := corsMiddleware(mux)
		cors := func(t *testing.T, res *http.Response, origin string) {
			t.Helper()
			if got := res.Header.Get("Access-Control-Allow-Origin"); got != origin {
				t.Fatalf("%d: Access-Control-Allow-Origin %q, want %q", res.StatusCode, got, origin)
			}
			if got := res.Header.Get("Access-Control-Expose-Headers"); !strings.Contains(got, "Idempotent-Replayed") || !strings.Contains(got, "Retry-After") {
				t.Fatalf("%d: Access-Control-Expose-Headers %q", res.StatusCode, got)
			}
		}

		// The preflight: answered by the CORS middleware, nothing claimed.
		pre := send(api, "OPTIONS", "/pay", "", "", "Origin", corsOrigins[0],
			"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type,idempotency-key")
		if pre.Code != http.StatusNoContent || pre.Header().Get("Access-Control-Allow-Origin") != corsOrigins[0] ||
			!strings.Contains(pre.Header().Get("Access-Control-Allow-Headers"), "Idempotency-Key") {
			t.Fatalf("preflight: %d %v", pre.Code, pre.Header())
		}
		// The CORS middleware inside this one answers a preflight too: it
		// passes through the middleware untouched.
		inner := e.wrap(t, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u1", nil }}, corsMiddleware(http.NotFoundHandler()))
		if pre := send(inner, "OPTIONS", "/pay", "", "", "Origin", corsOrigins[0], "Access-Control-Request-Method", "POST"); pre.Code != http.StatusNoContent {
			t.Fatalf("preflight through the middleware: %d %s", pre.Code, pre.Body)
		}

		first := send(api, "POST", "/pay", "k", `{}`, "Origin", corsOrigins[0]).Result()
		cors(t, first, corsOrigins[0])
		firstBody := body(t, first.Body)
		if first.StatusCode != http.StatusCreated || first.Header.Get("Set-Cookie") != "sid=first" {
			t.Fatalf("first: %d %v", first.StatusCode, first.Header)
		}
		// The same principal retries from its other origin.
		retry := send(api, "POST", "/pay", "k", `{}`, "Origin", corsOrigins[1]).Result()
		cors(t, retry, corsOrigins[1])
		if retry.StatusCode != http.StatusCreated || retry.Header.Get(idemhttp.ReplayedHeader) != "true" || body(t, retry.Body) != firstBody {
			t.Fatalf("retry: %d %v", retry.StatusCode, retry.Header)
		}
		if retry.Header.Get("Location") != "/pay/1" || retry.Header.Get("Set-Cookie") != "" || retry.Header.Get("X-Request-Id") != "" {
			t.Fatalf("retry replayed %v", retry.Header)
		}
		if n := e.effects(t, "cors"); n != 1 || calls.Load() != 1 {
			t.Fatalf("executed %d times, %d effects", calls.Load(), n)
		}

		// The middleware's own answers carry the request's CORS headers.
		for _, c := range []struct {
			key, body string
			status    int
			typ       string
		}{
			{"", `{}`, http.StatusBadRequest, problem.TypeKeyMissing},
			{"k", `{"other":1}`, http.StatusConflict, problem.TypeKeyReused},
			{"big", `{"a":"` + strings.Repeat("x", 100) + `"}`, http.StatusRequestEntityTooLarge, problem.TypeBodyTooLarge},
		} {
			rr := send(api, "POST", "/pay", c.key, c.body, "Origin", corsOrigins[1])
			checkProblem(t, rr, c.status, c.typ)
			cors(t, rr.Result(), corsOrigins[1])
		}
		// 409 request-in-progress, with Retry-After. The first request
		// holds the key while its handler runs. Refused before it ran (a
		// 503 when the store answered too late on a loaded machine: twice
		// in CI runs under load, on SQLite), it is sent again, as a client
		// would.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var held sync.WaitGroup
		t.Cleanup(func() { cancel(); held.Wait() }) // before the store closes
		for try := 1; ; try++ {
			answered := make(chan *httptest.ResponseRecorder, 1)
			held.Go(func() {
				req := httptest.NewRequest("POST", "/slow", strings.NewReader(`{}`)).WithContext(ctx)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "slow")
				req.Header.Set("Origin", corsOrigins[0])
				rr := httptest.NewRecorder()
				api.ServeHTTP(rr, req)
				answered <- rr
			})
			var refused *httptest.ResponseRecorder
			select {
			case <-holding:
			case refused = <-answered:
			case <-ctx.Done():
				t.Fatal("the first request never ran")
			}
			if refused == nil {
				break
			}
			if refused.Code != http.StatusServiceUnavailable || try == 5 {
				t.Fatalf("the first request was answered %d before its handler ran (try %d): %s", refused.Code, try, refused.Body)
			}
			t.Logf("the first request was refused before its handler ran (try %d): %d %s", try, refused.Code, refused.Body)
		}
		rr := send(api, "POST", "/slow", "slow", `{}`, "Origin", corsOrigins[1])
		checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
		cors(t, rr.Result(), corsOrigins[1])
		if rr.Header().Get("Retry-After") == "" {
			t.Fatal("409 request-in-progress without Retry-After")
		}
	})
}
