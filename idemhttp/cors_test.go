package idemhttp_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
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
