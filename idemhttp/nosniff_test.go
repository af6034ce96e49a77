package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestStoredProblemReplayedWithNosniff: a stored problem document (a
// handler's 422 validation problem, or ModeLease's stored 500
// response-too-large) is replayed with the X-Content-Type-Options: nosniff
// it went out with, which docs/problems.md promises on every problem, from
// the store as from the replay cache.
func TestStoredProblemReplayedWithNosniff(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  idemhttp.Config
		h    http.HandlerFunc
	}{
		{"validation", idemhttp.Config{}, func(w http.ResponseWriter, r *http.Request) {
			problem.WriteError(w, http.StatusUnprocessableEntity, problem.TypeValidation, "Invalid amount", "amount must be positive")
		}},
		{"lease response-too-large", idemhttp.Config{Mode: idemhttp.ModeLease, MaxResponseBytes: 16},
			func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(strings.Repeat("x", 64)))
			}},
	}
	for _, c := range cases {
		forEach(t, func(t *testing.T, e *env) {
			for _, cache := range []int64{0, idemhttp.NoReplayCache} {
				cfg := c.cfg
				cfg.ReplayCacheBytes = cache
				cfg.Scope = func(*http.Request) (string, error) { return "p", nil }
				h := e.wrap(t, &cfg, c.h)
				for attempt := range 3 {
					rr := send(h, "POST", "/pay", "k-"+c.name, `{}`)
					if got := rr.Header().Get("X-Content-Type-Options"); got != "nosniff" {
						t.Errorf("%s, cache %d, attempt %d (%d, replayed %q): X-Content-Type-Options = %q, want nosniff",
							c.name, cache, attempt, rr.Code, rr.Header().Get(idemhttp.ReplayedHeader), got)
					}
				}
			}
		})
	}
}
