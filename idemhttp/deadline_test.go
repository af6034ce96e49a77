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
	"github.com/idemkit/idem/problem"
)

// TestDeadlineWhileClaimingAnswers: a request whose context has a deadline
// (a timeout middleware in front of idem) that passes while its claim waits
// (another request holds the key's lock, SQLite's only connection, or the
// key's lease) gets a 503 problem with Retry-After, not net/http's empty 200;
// its handler did not run.
func TestDeadlineWhileClaimingAnswers(t *testing.T) {
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				inside, release := make(chan struct{}), make(chan struct{})
				var block atomic.Bool
				block.Store(true)
				effect := effectHandler(t, e, 201, &calls)
				var outcomes []idemhttp.Outcome
				outc := make(chan idemhttp.Outcome, 4)
				h := e.wrap(t, &idemhttp.Config{Mode: mode, Wait: 3 * time.Second,
					OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outc <- o }},
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if block.Load() {
							close(inside)
							select {
							case <-release:
							case <-time.After(time.Minute):
							}
						}
						effect.ServeHTTP(w, r)
					}))
				done := make(chan int, 1)
				go func() { done <- send(h, "POST", "/pay?label=dl", "k", `{}`).Code }()
				<-inside
				block.Store(false)

				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				req := httptest.NewRequest("POST", "/pay?label=dl", strings.NewReader(`{}`)).WithContext(ctx)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "k")
				rr := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(rr, req)
				// Generous for a loaded machine; far below the holder's minute.
				if took := time.Since(start); took > 15*time.Second {
					t.Errorf("the request with a 300ms deadline took %s", took)
				}
				close(release)
				checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
				if rr.Header().Get("Retry-After") == "" {
					t.Error("no Retry-After")
				}
				if code := <-done; code != 201 {
					t.Fatalf("holder: %d, want 201", code)
				}
				outcomes = append(outcomes, <-outc, <-outc)
				if calls.Load() != 1 || e.effects(t, "dl") != 1 {
					t.Fatalf("calls = %d, effects = %d, want 1 and 1", calls.Load(), e.effects(t, "dl"))
				}
				if outcomes[0] != idemhttp.OutcomeStoreError {
					t.Fatalf("outcomes = %v, want store_error first", outcomes)
				}
			})
		})
	}
}
