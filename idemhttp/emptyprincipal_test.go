package idemhttp_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestEmptyPrincipalIsUnauthenticated: a Scope hook that finds no principal
// and returns "" without an error (an authentication middleware mounted
// after idem, a context value missing) must not put every such client in
// one shared key space, where a client reusing another's key would get the
// other's stored payment: the request answers 401 unauthenticated and
// nothing runs.
func TestEmptyPrincipalIsUnauthenticated(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
			return r.Header.Get("X-Principal"), nil // "" when the auth middleware did not run
		}}, effectHandler(t, e, 201, &calls))
		alice := send(h, "POST", "/pay?label=alice", "order-1", `{}`)
		checkProblem(t, alice, http.StatusUnauthorized, problem.TypeUnauthenticated)
		bob := send(h, "POST", "/pay?label=alice", "order-1", `{}`)
		checkProblem(t, bob, http.StatusUnauthorized, problem.TypeUnauthenticated)
		if calls.Load() != 0 {
			t.Fatalf("handler ran %d times for requests without a principal", calls.Load())
		}
		// A principal still works.
		if rr := send(h, "POST", "/pay?label=alice", "order-1", `{}`, "X-Principal", "alice"); rr.Code != 201 {
			t.Fatalf("with a principal: %d %s", rr.Code, rr.Body)
		}
	})
}
