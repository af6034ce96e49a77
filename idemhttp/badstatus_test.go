package idemhttp_test

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// TestInvalidStatusIsNotStored: a handler that calls WriteHeader with a
// code net/http refuses (0 from a status variable left unset on an error
// path) gets net/http's panic, as without idem: its writes roll back and
// the key stays free, instead of a stored 200 replayed for a day.
func TestInvalidStatusIsNotStored(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, 42} {
		forEach(t, func(t *testing.T, e *env) {
			var calls atomic.Int64
			bad := true
			h := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				if err := e.effect(r, "bad"); err != nil {
					t.Error(err)
				}
				if bad {
					w.WriteHeader(code)
					_, _ = io.WriteString(w, `{"error":"unmapped"}`)
					return
				}
				w.WriteHeader(201)
			}))
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("WriteHeader(%d): no panic; net/http panics on it", code)
					}
				}()
				rr := send(h, "POST", "/pay", "k", `{}`)
				t.Logf("WriteHeader(%d) answered %d %s", code, rr.Code, rr.Body)
			}()
			if n := e.effects(t, "bad"); n != 0 {
				t.Errorf("WriteHeader(%d): the handler's write was committed", code)
			}
			bad = false
			if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("WriteHeader(%d), retry: %d replayed=%q, want a new execution", code, rr.Code, rr.Header().Get(idemhttp.ReplayedHeader))
			}
		})
	}
}
