package idemhttp_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestTakeoverWaitIsBounded: a request for an expired record whose row is
// locked by a concurrent taker (its transaction runs the handler) answers
// 409 request-in-progress within Config.Wait, instead of blocking on the
// row lock until the other transaction ends.
func TestTakeoverWaitIsBounded(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	e := pgEnvOn(t, drv)
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	var calls atomic.Int64
	h := e.wrap(t, &idemhttp.Config{Now: clock, Wait: 300 * time.Millisecond}, effectHandler(t, e, 201, &calls))
	if rr := send(h, "POST", "/pay?label=tk", "k", `{}`); rr.Code != 201 {
		t.Fatalf("first request: %d", rr.Code)
	}
	now.Add(int64(25 * time.Hour)) // the record expired

	// Another taker holds the expired row (as a ModeTx takeover does while
	// its handler runs).
	ctx := context.Background()
	tx, err := drv.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_record FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done, released := make(chan struct{}), make(chan struct{})
	go func() { // the other taker finishes after 5s, or when the test ends
		defer close(released)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		_ = tx.Rollback(ctx)
	}()
	defer func() {
		close(done)
		<-released
	}()

	start := time.Now()
	rr := send(h, "POST", "/pay?label=tk", "k", `{}`)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the duplicate waited %s on the taker's row lock; Wait is 300ms", took.Round(time.Millisecond))
	}
	checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
	if calls.Load() != 1 {
		t.Fatalf("calls = %d, want 1", calls.Load())
	}
}

// TestWriteAfterHandlerReturned: a handler goroutine writing to the
// ResponseWriter after the handler returned must not race with storing the
// response, and must not change what was stored.
func TestWriteAfterHandlerReturned(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, e *env) {
				late := make(chan struct{})
				h := e.wrap(t, &idemhttp.Config{Mode: mode}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(201)
					_, _ = w.Write([]byte("stored"))
					go func() {
						defer close(late)
						time.Sleep(10 * time.Millisecond) // the handler has returned
						for range 50 {
							_, _ = w.Write([]byte("-late"))
						}
					}()
				}))
				rr := send(h, "POST", "/late", "k", `{}`)
				<-late
				if rr.Code != 201 || rr.Body.String() != "stored" {
					t.Fatalf("first answer: %d %q", rr.Code, rr.Body.String())
				}
				rr = send(h, "POST", "/late", "k", `{}`)
				if rr.Header().Get(idemhttp.ReplayedHeader) != "true" || rr.Body.String() != "stored" {
					t.Fatalf("replay: %q (replayed %q)", rr.Body.String(), rr.Header().Get(idemhttp.ReplayedHeader))
				}
			})
		})
	}
}
