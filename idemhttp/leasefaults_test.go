package idemhttp_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// faultyDriver is a SQLite driver whose executor fails the first
// failComplete RecordComplete calls, and runs onClaim after each
// RecordClaim (ModeLease uses Records, never a transaction).
type faultyDriver struct {
	*sqlitedriver.Driver
	failComplete atomic.Int32
	onClaim      func()
}

func (d *faultyDriver) Records() driver.RecordExecutor {
	return faultyExecutor{RecordExecutor: d.Driver.Records(), d: d}
}

type faultyExecutor struct {
	driver.RecordExecutor
	d *faultyDriver
}

func (e faultyExecutor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	if e.d.failComplete.Add(-1) >= 0 {
		return errors.New("transient: connection reset")
	}
	return e.RecordExecutor.RecordComplete(ctx, p)
}

func (e faultyExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	res, err := e.RecordExecutor.RecordClaim(ctx, p)
	if e.d.onClaim != nil {
		e.d.onClaim()
	}
	return res, err
}

func leaseMiddleware(t *testing.T, drv *faultyDriver, cfg *idemhttp.Config, h http.Handler) http.Handler {
	t.Helper()
	cfg.Mode = idemhttp.ModeLease
	mw, err := idemhttp.New[*sql.Tx](drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw.Handler(h)
}

// A transient failure to store a lease-mode outcome is retried: the
// response is stored, and the retry of the request gets the replay instead
// of executing the external effect again once the lease expires.
func TestLeaseCompleteRetried(t *testing.T) {
	t.Parallel()
	drv := &faultyDriver{Driver: testdb.SQLite(t)}
	drv.failComplete.Store(2)
	var calls atomic.Int64
	h := leaseMiddleware(t, drv, &idemhttp.Config{Wait: idemhttp.NoWait}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charged":true}`))
	}))
	if rr := send(h, "POST", "/charge", "k1", `{}`); rr.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", rr.Code, rr.Body)
	}
	rr := send(h, "POST", "/charge", "k1", `{}`)
	if rr.Code != http.StatusCreated || rr.Header().Get("Idempotent-Replayed") != "true" || rr.Body.String() != `{"charged":true}` {
		t.Fatalf("retry: %d %q replayed=%q; want the stored 201", rr.Code, rr.Body, rr.Header().Get("Idempotent-Replayed"))
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}

// A claim that waited longer than a heartbeat interval (here: the clock
// jumps past the lease during the claim) renews its lease before running
// the handler, so a duplicate cannot take over from the live owner.
func TestLeaseRenewedAfterSlowClaim(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	drv := &faultyDriver{Driver: testdb.SQLite(t)}
	var slowClaims atomic.Int32
	slowClaims.Store(1)
	drv.onClaim = func() {
		if slowClaims.Add(-1) >= 0 {
			now.Add(int64(time.Minute)) // the first claim "waited" a minute
		}
	}
	var calls atomic.Int64
	running, finish := make(chan struct{}), make(chan struct{})
	h := leaseMiddleware(t, drv, &idemhttp.Config{Wait: idemhttp.NoWait, Now: clock, Lease: 30 * time.Second},
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if calls.Add(1) == 1 {
				close(running)
				<-finish
			}
			w.WriteHeader(http.StatusCreated)
		}))
	first := make(chan int, 1)
	go func() { first <- send(h, "POST", "/charge", "k2", `{}`).Code }()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request's handler did not start")
	}
	rr := send(h, "POST", "/charge", "k2", `{}`)
	close(finish)
	checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
	if code := <-first; code != http.StatusCreated {
		t.Errorf("first request: %d", code)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times while its owner was alive, want 1", calls.Load())
	}
}

// lostDriver is a SQLite driver whose CommitComplete always reports the
// key stored by another writer (and rolls back), though no record is ever
// stored: a driver that misreports, say, a failure of the handler's own
// constraint as a lost key.
type lostDriver struct {
	*sqlitedriver.Driver
}

func (d lostDriver) CommitComplete(_ context.Context, tx *sql.Tx, _ *driver.TxCompleteParams) error {
	_ = tx.Rollback()
	return fmt.Errorf("lost: %w", driver.ErrLeaseLost)
}

// A completed record's INSERT that keeps reporting the key taken, with no
// record to replay, runs the handler a bounded number of times, then
// answers 503 store-unavailable (retryable: nothing was committed), instead
// of running it until the client gives up.
func TestTxClaimLeaseLostBounded(t *testing.T) {
	t.Parallel()
	drv := lostDriver{Driver: testdb.SQLite(t)}
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeTx})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- send(h, "POST", "/charge", "k", `{}`) }()
	select {
	case rr := <-done:
		checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
	case <-time.After(20 * time.Second):
		t.Fatalf("the request did not end; the handler ran %d times", calls.Load())
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

// A failure (here 503 with Retry-After) whose body is over MaxResponseBytes
// is not stored, in either mode: the client gets the handler's status and
// Retry-After with a problem body, and a retry executes again. (ModeLease
// used to store a 500 for the whole TTL: the failure was cached.)
func TestFailureTooLargeNotStored(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			mw, err := idemhttp.New[*sql.Tx](testdb.SQLite(t), &idemhttp.Config{Mode: mode, MaxResponseBytes: 1024})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				calls.Add(1)
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write(bytes.Repeat([]byte("x"), 4096))
			}))
			for i := range 2 {
				rr := send(h, "POST", "/charge", "k", `{}`)
				checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeResponseTooLarge)
				// "stored": false tells a client this one may be retried,
				// unlike a stored 500 response-too-large.
				if v, ok := storedMember(t, rr); !ok || v != false {
					t.Fatalf("attempt %d: stored member %v (present %v), want false", i, v, ok)
				}
				if rr.Header().Get("Retry-After") != "7" || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
					t.Fatalf("attempt %d: Retry-After %q, replayed %q", i, rr.Header().Get("Retry-After"), rr.Header().Get(idemhttp.ReplayedHeader))
				}
			}
			if n := calls.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2 (the failure must not be stored)", n)
			}
		})
	}
}

// storedMember returns the "stored" member of rr's problem document.
func storedMember(t *testing.T, rr *httptest.ResponseRecorder) (any, bool) {
	t.Helper()
	var p problem.Problem
	if err := p.UnmarshalJSON(rr.Body.Bytes()); err != nil {
		t.Fatalf("body %q: %v", rr.Body.String(), err)
	}
	v, ok := p.Extensions["stored"]
	return v, ok
}

// renewFaultDriver is a SQLite driver whose lease renewals go through
// extend, which may fail them (next renews for real).
type renewFaultDriver struct {
	*sqlitedriver.Driver
	extend func(ctx context.Context, p *driver.RecordExtendLeaseParams, next func() error) error
}

func (d *renewFaultDriver) Records() driver.RecordExecutor {
	return renewFaultExecutor{RecordExecutor: d.Driver.Records(), d: d}
}

type renewFaultExecutor struct {
	driver.RecordExecutor
	d *renewFaultDriver
}

func (e renewFaultExecutor) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	return e.d.extend(ctx, p, func() error { return e.RecordExecutor.RecordExtendLease(ctx, p) })
}

// A lease renewal that hangs (a dead connection) is abandoned after the
// renewal interval and the next one extends the lease in time: a retry
// that arrives after the first lease would have expired finds the owner
// alive (409 request-in-progress) instead of taking the key over and
// running the handler a second time.
func TestLeaseRenewalThatHangs(t *testing.T) {
	t.Parallel()
	var hang atomic.Int32 // the first renewal blocks until its deadline
	hang.Store(1)
	drv := &renewFaultDriver{Driver: testdb.SQLite(t), extend: func(ctx context.Context, _ *driver.RecordExtendLeaseParams, next func() error) error {
		if hang.Add(-1) >= 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return next()
	}}
	// The renewal after the hung one has what is left of the lease: at
	// most Lease/3 (1 s here). Under -race on 2 busy cores a SQLite
	// renewal has taken over 500 ms, so a shorter lease made this flaky.
	const lease = 3 * time.Second
	var calls atomic.Int64
	running := make(chan struct{})
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			close(running)
			time.Sleep(lease + lease/2) // outlives the first lease
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan int, 1)
	go func() { first <- send(h, "POST", "/charge", "k", `{}`).Code }()
	waitStarted(t, running, first)
	time.Sleep(lease + lease/6) // past the first lease's expiry
	rr := send(h, "POST", "/charge", "k", `{}`)
	checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
	select {
	case code := <-first:
		if code != http.StatusCreated {
			t.Fatalf("first request: %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the first request never finished: its stuck renewal was waited for")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1 (the live owner was taken over)", n)
	}
}

// A renewal that fails at once (its connection found dead: a DBA's
// pg_terminate_backend, a failover) is retried within a fraction of a
// second, not an interval later: three failing in a row cost the lease
// nothing, where they used to cost all of it (renewals at Lease/3,
// 2Lease/3 and Lease failed: the handler's context was cancelled and a
// retry could run the command a second time).
func TestLeaseRenewalRetriedPromptly(t *testing.T) {
	t.Parallel()
	const lease = 4500 * time.Millisecond // renewals every 1.5s
	var (
		failing atomic.Int32 // renewals still to fail
		mu      sync.Mutex
		at      []time.Time // when each renewal was attempted
	)
	failing.Store(3)
	drv := &renewFaultDriver{Driver: testdb.SQLite(t), extend: func(_ context.Context, _ *driver.RecordExtendLeaseParams, next func() error) error {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if failing.Add(-1) >= 0 {
			return errors.New("conn closed")
		}
		return next()
	}}
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-time.After(lease + lease/9): // outlives the lease the claim wrote
		case <-r.Context().Done():
			t.Errorf("the handler's context ended: %v", context.Cause(r.Context()))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if rr := send(h, "POST", "/charge", "k", `{}`); rr.Code != http.StatusCreated {
		t.Fatalf("first: %d %s, want 201", rr.Code, rr.Body)
	}
	if rr := send(h, "POST", "/charge", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" || calls.Load() != 1 {
		t.Fatalf("retry: %d %s, %d executions; want the replay of one", rr.Code, rr.Body, calls.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) < 4 {
		t.Fatalf("%d renewals attempted, want the 3 failed and one that succeeded", len(at))
	}
	for i := 1; i < 4; i++ {
		if d := at[i].Sub(at[i-1]); d > lease/4 {
			t.Errorf("renewal %d came %s after the failed one, want within %s (not the interval, %s)", i+1, d, lease/4, lease/3)
		}
	}
}

// OnOutcome is called once per protected request, also when the client
// goes away (its request's context is cancelled) while its request waits
// for the key a concurrent one holds (OutcomeAbandoned), in both modes.
func TestOutcomeReportedWhenClientGoesAway(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			var (
				mu       sync.Mutex
				outcomes []idemhttp.Outcome
			)
			mw, err := idemhttp.New[*sql.Tx](testdb.SQLite(t), &idemhttp.Config{
				Mode: mode, Wait: 30 * time.Second,
				Scope: func(*http.Request) (string, error) { return "c", nil },
				OnOutcome: func(_ *http.Request, o idemhttp.Outcome) {
					mu.Lock()
					outcomes = append(outcomes, o)
					mu.Unlock()
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			running, finish := make(chan struct{}), make(chan struct{})
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				close(running)
				<-finish
				w.WriteHeader(http.StatusCreated)
			}))
			first := make(chan int, 1)
			go func() { first <- send(h, "POST", "/charge", "k", `{}`).Code }()
			waitStarted(t, running, first)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			time.AfterFunc(300*time.Millisecond, cancel) // the client goes away
			req := httptest.NewRequestWithContext(ctx, "POST", "/charge", strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "k")
			h.ServeHTTP(httptest.NewRecorder(), req) // waits for the key until ctx ends
			close(finish)
			if code := <-first; code != http.StatusCreated {
				t.Fatalf("first request: %d", code)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(outcomes) != 2 || outcomes[0] != idemhttp.OutcomeAbandoned || outcomes[1] != idemhttp.OutcomeExecuted {
				t.Fatalf("outcomes = %v; want [abandoned executed]", outcomes)
			}
		})
	}
}

// A ModeLease handler whose lease is lost is told so: its context ends
// with the cause driver.ErrLeaseLost, so that a handler about to call a
// payment provider does not make a call another request may make too.
func TestLeaseLostCancelsTheHandler(t *testing.T) {
	t.Parallel()
	// The first renewal comes at 1s; the lease would end at 3s: room for a
	// loaded machine's stall between the two.
	const lease = 3 * time.Second
	lost := &renewFaultDriver{Driver: testdb.SQLite(t), extend: func(context.Context, *driver.RecordExtendLeaseParams, func() error) error {
		return driver.ErrLeaseLost // another request took the key over
	}}
	mw, err := idemhttp.New[*sql.Tx](lost, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	cause := make(chan error, 1)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(time.Minute):
			cause <- nil
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	start := time.Now()
	send(h, "POST", "/charge", "k", `{}`)
	if err := <-cause; !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("handler context: cause %v; want driver.ErrLeaseLost", err)
	}
	if d := time.Since(start); d > lease {
		t.Errorf("told after %s, want at the first renewal (%s), before the lease ends", d, lease/3)
	}
}

// lateLeaseDriver is a SQLite driver whose lease-mode claim returns late
// (a slow round trip) and whose lease renewals all hang until their
// deadline (a dead connection).
type lateLeaseDriver struct {
	*sqlitedriver.Driver
	claimDelay time.Duration
	leaseEnd   atomic.Int64 // the claim's LeaseExpiresAt, Unix nanoseconds
}

func (d *lateLeaseDriver) Records() driver.RecordExecutor {
	return lateLeaseExecutor{RecordExecutor: d.Driver.Records(), d: d}
}

type lateLeaseExecutor struct {
	driver.RecordExecutor
	d *lateLeaseDriver
}

func (e lateLeaseExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	res, err := e.RecordExecutor.RecordClaim(ctx, p)
	e.d.leaseEnd.Store(p.LeaseExpiresAt.UnixNano())
	time.Sleep(e.d.claimDelay)
	return res, err
}

func (e lateLeaseExecutor) RecordExtendLease(ctx context.Context, _ *driver.RecordExtendLeaseParams) error {
	<-ctx.Done()
	return ctx.Err()
}

// When no renewal succeeds, the handler's context ends when the lease
// written by the claim ends, not up to a renewal interval later (the
// heartbeat counted the lease from its own start, after the claim's round
// trip): from then on another request may take the key over.
func TestLeaseExpiryCountedFromTheClaim(t *testing.T) {
	t.Parallel()
	// The claim's delay (the lateness of the old heartbeat) stays well
	// under Lease/3 (no fresh renewal before the handler), and well over
	// the bound below, even on a loaded machine that stalls the process.
	const lease = 6 * time.Second
	drv := &lateLeaseDriver{Driver: testdb.SQLite(t), claimDelay: time.Second}
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	type end struct {
		at    time.Time
		cause error
	}
	ended := make(chan end, 1)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			ended <- end{time.Now(), context.Cause(r.Context())}
		case <-time.After(3 * lease):
			ended <- end{}
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- send(h, "POST", "/charge", "k", `{}`) }()
	var e end
	select {
	case e = <-ended:
	case rr := <-answered:
		t.Fatalf("answered %d %s without running the handler", rr.Code, rr.Body)
	case <-time.After(5 * lease):
		t.Fatal("no answer")
	}
	<-answered
	if !errors.Is(e.cause, driver.ErrLeaseLost) {
		t.Fatalf("handler context: cause %v; want driver.ErrLeaseLost", e.cause)
	}
	leaseEnd := time.Unix(0, drv.leaseEnd.Load())
	if late := e.at.Sub(leaseEnd); late > 700*time.Millisecond {
		t.Fatalf("the handler's context ended %s after the lease written by the claim", late.Round(time.Millisecond))
	}
}

// A claim that returned after Lease/3 has its lease renewed before the
// handler runs; a renewal that hangs (a dead connection) is given up after
// Lease/3 like the heartbeat's: the key is released and the request
// answered 503 without running the handler, instead of waiting for as long
// as the client does.
func TestFreshLeaseRenewalBounded(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	drv := &lateLeaseDriver{Driver: testdb.SQLite(t), claimDelay: lease / 2}
	mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	start := time.Now()
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- send(h, "POST", "/charge", "k", `{}`) }()
	select {
	case rr := <-answered:
		checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
	case <-time.After(time.Minute):
		t.Fatalf("no answer after a minute: the renewal before the handler hangs with the connection")
	}
	// lease/2+lease/3 on an idle machine; generous for a loaded one, far
	// below the minute of a renewal that hangs with the connection.
	if d := time.Since(start); d > lease/2+lease/3+15*time.Second {
		t.Errorf("answered after %s", d.Round(time.Millisecond))
	}
	if calls.Load() != 0 {
		t.Fatalf("the handler ran %d times without a renewed lease", calls.Load())
	}
}
