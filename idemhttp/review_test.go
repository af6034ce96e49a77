package idemhttp_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestTakeoverWaitIsBounded: a request for an expired record that a
// concurrent request is taking over (its transaction runs the handler)
// answers 409 request-in-progress within Config.Wait, instead of blocking
// until the other transaction ends; the handler runs once for the takeover.
func TestTakeoverWaitIsBounded(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	e := pgEnvOn(t, drv)
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	var calls atomic.Int64
	inside, release := make(chan struct{}), make(chan struct{})
	var block atomic.Bool
	effect := effectHandler(t, e, 201, &calls)
	h := e.wrap(t, &idemhttp.Config{Now: clock, Wait: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if block.Load() {
			close(inside)
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		}
		effect.ServeHTTP(w, r)
	}))
	if rr := send(h, "POST", "/pay?label=tk", "k", `{}`); rr.Code != 201 {
		t.Fatalf("first request: %d", rr.Code)
	}
	now.Add(int64(25 * time.Hour)) // the record expired

	// The takeover: its handler runs until the duplicate was answered (at
	// most a minute).
	block.Store(true)
	taken := make(chan int, 1)
	go func() { taken <- send(h, "POST", "/pay?label=tk", "k", `{}`).Code }()
	<-inside
	block.Store(false)

	start := time.Now()
	rr := send(h, "POST", "/pay?label=tk", "k", `{}`)
	if took := time.Since(start); took > 15*time.Second { // generous for a loaded machine
		t.Fatalf("the duplicate waited %s for the takeover; Wait is 300ms", took.Round(time.Millisecond))
	}
	checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
	close(release)
	if code := <-taken; code != 201 {
		t.Fatalf("takeover: %d, want 201", code)
	}
	if calls.Load() != 2 {
		t.Fatalf("calls = %d, want 2 (the first request and the takeover)", calls.Load())
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
