package idemhttp_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// A CORS middleware outside the idempotency middleware adds Vary: Origin
// (its Access-Control-Allow-Origin depends on it), and the handler adds
// Vary values of its own (Accept-Language): the response varies on both,
// as it does without the idempotency middleware, on the first answer and
// on a replay (Vary listed in ReplayHeaders or not). A cache that stores
// the answer without Vary: Origin serves one origin's
// Access-Control-Allow-Origin to another, whose browser refuses it.
func TestOuterVaryKept(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Vary", "Accept-Language")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{}`))
		})
		want := []string{"Origin", "Accept-Language"}
		if got := send(corsMiddleware(handler), "POST", "/pay", "k", `{}`, "Origin", corsOrigins[0]).Header().Values("Vary"); !slices.Equal(got, want) {
			t.Fatalf("without the middleware: Vary %q", got)
		}
		for i, cfg := range []idemhttp.Config{
			{},
			{ReplayHeaders: []string{"Vary"}},
			{ReplayHeaders: []string{"Vary"}, ReplayCacheBytes: idemhttp.NoReplayCache},
		} {
			cfg.Scope = func(*http.Request) (string, error) { return "u1", nil }
			api := corsMiddleware(e.wrap(t, &cfg, handler))
			key := fmt.Sprint("k", i)
			first := send(api, "POST", "/pay", key, `{}`, "Origin", corsOrigins[0])
			if got := first.Header().Values("Vary"); !slices.Equal(got, want) {
				t.Fatalf("ReplayHeaders %q: first answer's Vary %q, want %q", cfg.ReplayHeaders, got, want)
			}
			replay := send(api, "POST", "/pay", key, `{}`, "Origin", corsOrigins[1])
			if replay.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("not replayed: %d %s", replay.Code, replay.Body)
			}
			wantReplay := want
			if len(cfg.ReplayHeaders) == 0 {
				wantReplay = want[:1] // the handler's Vary is not stored
			}
			if got := replay.Header().Values("Vary"); !slices.Equal(got, wantReplay) {
				t.Fatalf("ReplayHeaders %q: replay's Vary %q, want %q", cfg.ReplayHeaders, got, wantReplay)
			}
		}
	})
}
