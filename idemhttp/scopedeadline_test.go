package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestScopeContextEndedIsNotUnauthenticated: a Scope hook that looks the
// principal up (an HMAC secret, an API key, in PostgreSQL) with the
// request's context, whose deadline passes (a timeout middleware in front
// of idem) or which is cancelled meanwhile, fails for no fault of the
// credentials. It was answered 401 unauthenticated with the hook's error
// as detail, which clients (idemclient) do not retry: the operation was
// dropped as if its credentials were wrong. It answers 503
// store-unavailable with Retry-After, as the other points where the
// request's context ends before the claim; nothing runs.
func TestScopeContextEndedIsNotUnauthenticated(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want idemhttp.Outcome
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, idemhttp.OutcomeStoreError},
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, idemhttp.OutcomeAbandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			outc := make(chan idemhttp.Outcome, 2)
			mw, err := idemhttp.New(drv, &idemhttp.Config{
				Scope: func(r *http.Request) (string, error) {
					var principal string
					err := drv.Pool().QueryRow(r.Context(), `SELECT 'alice' FROM pg_sleep(5)`).Scan(&principal)
					return principal, err
				},
				OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outc <- o },
			})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(201)
			}))
			ctx, cancel := tc.ctx()
			defer cancel()
			req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`)).WithContext(ctx)
			req.Header.Set("Idempotency-Key", "k-"+tc.name)
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			if rr.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
			if o := <-outc; o != tc.want {
				t.Errorf("outcome %v, want %v", o, tc.want)
			}
			if calls.Load() != 0 {
				t.Fatalf("handler ran %d times", calls.Load())
			}
		})
	}
}
