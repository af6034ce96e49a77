package idemhttp_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// TestUnstorableScopeIsHashed: a scope PostgreSQL cannot store (the route
// is the decoded URL path when no ServeMux pattern matched: invalid UTF-8,
// a NUL byte, several KB; or such a principal) is stored hashed: the
// request executes once and its retry is replayed, on every backend,
// instead of 503 on every attempt.
func TestUnstorableScopeIsHashed(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
			return r.Header.Get("X-Principal"), nil
		}}, effectHandler(t, e, 201, &calls))
		cases := []struct{ name, target, principal string }{
			{"invalid UTF-8", "/files/%ff", "p"},
			{"NUL", "/files/%00", "p"},
			{"long path", "/files/" + strings.Repeat("a", 3000), "p"},
			{"principal", "/files/x", "p\x00\xff" + strings.Repeat("b", 3000)},
		}
		for i, c := range cases {
			for attempt := range 2 {
				rr := send(h, "POST", c.target, "k", `{}`, "X-Principal", c.principal)
				if rr.Code != 201 {
					t.Fatalf("%s, attempt %d: %d %s", c.name, attempt, rr.Code, rr.Body)
				}
				if replayed := rr.Header().Get(idemhttp.ReplayedHeader) == "true"; replayed != (attempt == 1) {
					t.Fatalf("%s, attempt %d: replayed = %v", c.name, attempt, replayed)
				}
			}
			if calls.Load() != int64(i+1) {
				t.Fatalf("%s: calls = %d, want %d", c.name, calls.Load(), i+1)
			}
		}
	})
}
