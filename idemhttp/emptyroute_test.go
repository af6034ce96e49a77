package idemhttp_test

import (
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testlog"
)

// TestEmptyRouteWarnsOnce: a Route hook that returns "" (chi's
// RouteContext(ctx).RoutePattern() read by a middleware mounted with
// r.Use on the top router, which runs before chi routes the request) puts
// every endpoint of a principal and method in one scope: a key used on
// POST /payments answers 409 key-reused on POST /refunds, where the
// documentation promises a new scope. Nothing said so; the middleware now
// logs one WARN naming the cause, and keeps the scope (a record stored
// under it must still be found by its retries).
func TestEmptyRouteWarnsOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		for _, tc := range []struct {
			name  string
			route func(*http.Request) string
			warns int
		}{
			{"empty", func(*http.Request) string { return "" }, 1},
			{"default", nil, 0},
		} {
			var logs testlog.Buffer
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{
				Route:  tc.route,
				Scope:  func(*http.Request) (string, error) { return "alice", nil },
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}, effectHandler(t, e, 201, &calls))
			for _, target := range []string{"/payments?label=" + tc.name, "/refunds?label=" + tc.name, "/payments?label=" + tc.name} {
				send(h, "POST", target, "k-"+tc.name, `{}`)
			}
			if n := strings.Count(logs.String(), "Config.Route returned an empty route"); n != tc.warns {
				t.Errorf("%s: %d warnings, want %d; logs:\n%s", tc.name, n, tc.warns, logs.String())
			}
		}
	})
}
