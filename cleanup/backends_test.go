package cleanup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/fixture"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

// runCleanup runs the cleaner of package cleanup against the backend that
// newDriver builds: nothing younger than a table's retention is deleted,
// everything older is, in several batches; unpublished outbox rows never are;
// a record replayed while a sweep runs is still replayed byte for byte, and
// one that expires meanwhile executes at most once per lifetime; inserts
// under a concurrent sweep never fail; of two replicas started at once
// exactly one sweeps and the other reports Skipped; replicas never sweep at
// the same time; a dead replica's lease is taken over once it expires; a
// replica whose lease was taken over stops; cancelling stops a sweep within
// one batch; finished sagas older than their retention are deleted with
// their steps, young ones are kept, and running, compensating and failed
// sagas never are.
//
// newDriver has the contract of Run's. openReplica returns a second driver
// on drv's database with its own connections, as a second process would
// open it; it registers its own cleanup with t.
func runCleanup[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx], openReplica func(t *testing.T, drv driver.Driver[TTx]) driver.Driver[TTx]) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, drv driver.Driver[TTx], replica func() driver.Driver[TTx])
	}{
		{"KeepsYoungDeletesOldInBatches", testCleanupRetention[TTx]},
		{"ReplayDuringSweep", testCleanupReplay[TTx]},
		{"ExpiringRecordDuringSweeps", testCleanupExpiringReplay[TTx]},
		{"InsertsDuringSweep", testCleanupInsertLoad[TTx]},
		{"TwoReplicasOneSweeps", testCleanupTwoReplicas[TTx]},
		{"ReplicasNeverSweepAtOnce", testCleanupMutualExclusion[TTx]},
		{"DeadReplicaLeaseTakenOver", testCleanupDeadReplica[TTx]},
		{"LeaseLostStopsSweep", testCleanupLeaseLost[TTx]},
		{"CancelStopsSweep", testCleanupCancel[TTx]},
		{"FinishedSagas", testCleanupFinishedSagas[TTx]},
	}
	t.Run("Cleanup", func(t *testing.T) {
		t.Parallel()
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				drv := newDriver(t)
				tt.fn(t, drv, func() driver.Driver[TTx] { return openReplica(t, drv) })
			})
		}
	})
}

// ---- cleanup helpers -------------------------------------------------------

func clConfig(now func() time.Time) *cleanup.Config {
	return &cleanup.Config{
		Now:       now,
		BatchSize: 7,
		Pause:     cleanup.NoPause,
		Logger:    slog.New(slog.DiscardHandler),
	}
}

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func newCleaner[TTx any](t *testing.T, drv driver.Driver[TTx], cfg *cleanup.Config) *cleanup.Cleaner[TTx] {
	t.Helper()
	c, err := cleanup.New(drv, cfg)
	if err != nil {
		t.Fatalf("cleanup.New: %v", err)
	}
	return c
}

func runOnce[TTx any](t *testing.T, c *cleanup.Cleaner[TTx]) cleanup.Report {
	t.Helper()
	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce: %v (report %+v)", err, rep)
	}
	return rep
}

// clRecords claims n records created at created and expiring at expires.
func clRecords(t *testing.T, ex driver.Executor, prefix string, n int, created, expires time.Time) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		p := claimAt(keys[i], "fp", newToken(), created)
		p.ExpiresAt = expires
		mustClaim(t, ex, p)
	}
	return keys
}

// clPublished stores n outbox rows and marks them published at at.
func clPublished[TTx any](t *testing.T, drv driver.Driver[TTx], n int, at time.Time) {
	t.Helper()
	ctx := t.Context()
	rows := make([]driver.OutboxRow, n)
	for i := range rows {
		id := uuid.New()
		rows[i] = driver.OutboxRow{EventID: id, EventType: "Test.Cleaned.v1", Key: "key-" + id.String(),
			OccurredAt: at, Payload: []byte(`{}`), CreatedAt: at}
	}
	if _, err := drv.Executor().OutboxInsert(ctx, rows); err != nil {
		t.Fatalf("OutboxInsert: %v", err)
	}
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	defer func() { _ = drv.Rollback(context.Background(), tx) }()
	ex := drv.UnwrapExecutor(tx)
	claimed, err := ex.OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: at, Limit: n + 1})
	if err != nil || len(claimed) != n {
		t.Fatalf("OutboxClaimBatch = %d rows, %v; want %d", len(claimed), err, n)
	}
	ids := make([]int64, n)
	for i, r := range claimed {
		ids[i] = r.ID
	}
	if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: ids, At: at}); err != nil {
		t.Fatalf("OutboxMarkPublished: %v", err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func wantDeleted(t *testing.T, rep cleanup.Report, table string, want int) {
	t.Helper()
	if got := rep.Deleted(table); got != want {
		t.Errorf("sweep at %s deleted %d rows of %s; want %d (report %+v)", rep.Started, got, table, want, rep.Tables)
	}
}

// probeRule is a Rule that reports every call and deletes nothing unless
// del says so.
func probeRule(del func(ctx context.Context, limit int) (int, error)) cleanup.Rule {
	return cleanup.Rule{Table: "probe", Delete: func(ctx context.Context, _ driver.Executor, _ time.Time, limit int) (int, error) {
		return del(ctx, limit)
	}}
}

// ---- cleanup tests ---------------------------------------------------------

func testCleanupRetention[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	ex, now := drv.Executor(), t0
	oldRec := clRecords(t, ex, "old", 20, now.Add(-49*time.Hour), now.Add(-25*time.Hour))
	oldRec = append(oldRec, clRecords(t, ex, "edge", 1, now.Add(-24*time.Hour), now)...) // expires_at == now: expired
	liveRec := clRecords(t, ex, "live", 5, now.Add(-time.Hour), now.Add(time.Microsecond))

	oldIn, edgeIn, youngIn := fixture.NewIDs(t, 25), fixture.NewIDs(t, 1), fixture.NewIDs(t, 5)
	fixture.InboxInsert(t, ex, consumerA, oldIn, now.Add(-72*time.Hour-time.Microsecond))
	fixture.InboxInsert(t, ex, consumerB, edgeIn, now.Add(-72*time.Hour)) // exactly the TTL old: kept
	fixture.InboxInsert(t, ex, consumerA, youngIn, now.Add(-71*time.Hour))

	clPublished(t, drv, 15, now.Add(-25*time.Hour))
	clPublished(t, drv, 4, now.Add(-23*time.Hour))
	pendingAt := now.Add(-100 * time.Hour) // never published: never deleted
	if _, err := ex.OutboxInsert(t.Context(), []driver.OutboxRow{{EventID: uuid.New(), EventType: "Test.Pending.v1",
		Key: "pending", OccurredAt: pendingAt, Payload: []byte(`{}`), CreatedAt: pendingAt}}); err != nil {
		t.Fatalf("OutboxInsert: %v", err)
	}

	c := newCleaner(t, drv, clConfig(fixedClock(now)))
	rep := runOnce(t, c)
	if rep.Skipped {
		t.Fatal("sweep skipped with no other replica")
	}
	wantDeleted(t, rep, cleanup.TableRecords, 21)
	wantDeleted(t, rep, cleanup.TableInbox, 25)
	wantDeleted(t, rep, cleanup.TableOutbox, 15)
	for _, tr := range rep.Tables {
		if want := tr.Deleted/7 + 1; tr.Batches != want {
			t.Errorf("%s: %d rows in %d batches; want %d batches of at most 7", tr.Table, tr.Deleted, tr.Batches, want)
		}
	}
	for _, k := range oldRec {
		mustNotFind(t, ex, testScope, k)
	}
	for _, k := range liveRec {
		if _, err := ex.RecordGet(t.Context(), &driver.RecordGetParams{Scope: testScope, Key: k}); err != nil {
			t.Errorf("live record %s after the sweep: %v", k, err)
		}
	}
	if got := fixture.InboxInsert(t, ex, consumerB, edgeIn, now); len(got) != 0 {
		t.Errorf("inbox row exactly TTL old was deleted")
	}
	if got := fixture.InboxInsert(t, ex, consumerA, youngIn, now); len(got) != 0 {
		t.Errorf("%d inbox rows younger than the TTL were deleted", len(got))
	}

	// Everything older is eventually deleted: a later sweep takes the rest.
	later := now.Add(100 * time.Hour)
	rep = runOnce(t, newCleaner(t, drv, clConfig(fixedClock(later))))
	wantDeleted(t, rep, cleanup.TableRecords, 5)
	wantDeleted(t, rep, cleanup.TableInbox, 6)
	wantDeleted(t, rep, cleanup.TableOutbox, 4)
	for _, k := range liveRec {
		mustNotFind(t, ex, testScope, k)
	}
	if got := fixture.InboxInsert(t, ex, consumerA, append(oldIn, youngIn...), later); len(got) != 30 {
		t.Errorf("after both sweeps %d of 30 inbox ids were still deduplicated", 30-len(got))
	}
	oldest, ok, err := ex.OutboxOldestUnpublished(t.Context())
	if err != nil || !ok || !oldest.Equal(pendingAt) {
		t.Errorf("OutboxOldestUnpublished = %s, %v, %v; want the unpublished row of %s kept", oldest, ok, err, pendingAt)
	}
}

func testCleanupTwoReplicas[TTx any](t *testing.T, drv driver.Driver[TTx], replica func() driver.Driver[TTx]) {
	fixture.InboxInsert(t, drv.Executor(), consumerA, fixture.NewIDs(t, 30), t0.Add(-100*time.Hour))
	cleaners := []*cleanup.Cleaner[TTx]{
		newCleaner(t, drv, clConfig(fixedClock(t0))),
		newCleaner(t, replica(), clConfig(fixedClock(t0))),
	}
	reps := make([]cleanup.Report, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range cleaners {
		wg.Go(func() {
			<-start
			reps[i], errs[i] = c.RunOnce(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("replica %d: RunOnce: %v", i, errs[i])
		}
	}
	if reps[0].Skipped == reps[1].Skipped {
		t.Fatalf("Skipped = %v and %v; want exactly one replica to sweep", reps[0].Skipped, reps[1].Skipped)
	}
	swept, skipped := 0, 1
	if reps[0].Skipped {
		swept, skipped = 1, 0
	}
	wantDeleted(t, reps[swept], cleanup.TableInbox, 30)
	// The sweeper holds the lease for Hold after its sweep: the other
	// replica, woken a little later by the same schedule, still skips...
	if rep := runOnce(t, cleaners[skipped]); !rep.Skipped {
		t.Error("the other replica swept right after the first one finished; want Skipped during Hold")
	}
	// ... while the holder may sweep again.
	if rep := runOnce(t, cleaners[swept]); rep.Skipped {
		t.Error("the lease holder was skipped")
	}
}

func testCleanupMutualExclusion[TTx any](t *testing.T, drv driver.Driver[TTx], replica func() driver.Driver[TTx]) {
	var active, maxActive, calls atomic.Int32
	rule := probeRule(func(ctx context.Context, _ int) (int, error) {
		n := active.Add(1)
		defer active.Add(-1)
		for m := maxActive.Load(); n > m && !maxActive.CompareAndSwap(m, n); m = maxActive.Load() {
		}
		calls.Add(1)
		time.Sleep(20 * time.Millisecond)
		return 0, nil
	})
	drivers := []driver.Driver[TTx]{drv, replica(), replica()}
	const rounds = 6
	var swept, skipped atomic.Int32
	var wg sync.WaitGroup
	for _, d := range drivers {
		cfg := clConfig(time.Now)
		cfg.Hold = cleanup.NoHold
		cfg.Rules = []cleanup.Rule{rule}
		c := newCleaner(t, d, cfg)
		wg.Go(func() {
			for range rounds {
				rep, err := c.RunOnce(t.Context())
				if err != nil {
					t.Errorf("RunOnce: %v", err)
					return
				}
				if rep.Skipped {
					skipped.Add(1)
				} else {
					swept.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if m := maxActive.Load(); m != 1 {
		t.Errorf("%d sweeps ran at the same time; want 1", m)
	}
	if swept.Load() == 0 || swept.Load()+skipped.Load() != int32(len(drivers)*rounds) || calls.Load() != swept.Load() {
		t.Errorf("swept %d, skipped %d, rule called %d times", swept.Load(), skipped.Load(), calls.Load())
	}
}

func testCleanupDeadReplica[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	ex := drv.Executor()
	if ok, err := ex.LockAcquire(t.Context(), &driver.LockAcquireParams{Name: cleanup.DefaultLockName, Owner: "dead-replica", Now: t0, Until: t0.Add(time.Minute)}); err != nil || !ok {
		t.Fatalf("LockAcquire: %v, %v", ok, err)
	}
	if rep := runOnce(t, newCleaner(t, drv, clConfig(fixedClock(t0.Add(59*time.Second))))); !rep.Skipped {
		t.Error("swept while another replica's lease was live")
	}
	c := newCleaner(t, drv, clConfig(fixedClock(t0.Add(time.Minute))))
	if rep := runOnce(t, c); rep.Skipped {
		t.Error("skipped although the dead replica's lease had expired")
	}
	owner, until, err := ex.LockGet(t.Context(), &driver.LockGetParams{Name: cleanup.DefaultLockName})
	if err != nil || owner != c.Owner() || !until.Equal(t0.Add(time.Minute+cleanup.DefaultHold)) {
		t.Errorf("after the sweep the lease is %s until %s (%v); want %s until %s", owner, until, err, c.Owner(), t0.Add(time.Minute+cleanup.DefaultHold))
	}
}

func testCleanupLeaseLost[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	var clock atomic.Int64
	clock.Store(t0.UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	stolen := false
	cfg := clConfig(now)
	cfg.Lease = time.Second
	cfg.Rules = []cleanup.Rule{probeRule(func(ctx context.Context, limit int) (int, error) {
		if !stolen { // this replica stalls past its lease; another takes over
			stolen = true
			clock.Add((2 * time.Second).Microseconds())
			ok, err := drv.Executor().LockAcquire(ctx, &driver.LockAcquireParams{Name: cleanup.DefaultLockName, Owner: "thief", Now: now(), Until: now().Add(time.Hour)})
			if err != nil {
				return 0, fmt.Errorf("thief: %w", err)
			}
			if !ok {
				return 0, errors.New("thief could not take the expired lease")
			}
		}
		select { // "more rows": keep going until stopped
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
			return limit, nil
		}
	})}
	c := newCleaner(t, drv, cfg)
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	start := time.Now()
	_, err := c.RunOnce(t.Context())
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("RunOnce after losing the lease: err = %v; want ErrLeaseLost", err)
	}
	if d, stalled := time.Since(start), watch.Stop(); d > 3*time.Second+stalled {
		t.Errorf("the sweep went on for %s after losing the lease (the process stalled %s)", d, stalled)
	}
	if owner, _, err := drv.Executor().LockGet(t.Context(), &driver.LockGetParams{Name: cleanup.DefaultLockName}); err != nil || owner != "thief" {
		t.Errorf("lease owner after the loss = %q, %v; want the thief's lease untouched", owner, err)
	}
}

func testCleanupCancel[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	cfg := clConfig(fixedClock(t0))
	cfg.Records.Disabled, cfg.Inbox.Disabled, cfg.Outbox.Disabled, cfg.Sagas.Disabled = true, true, true, true
	cfg.Pause = 100 * time.Millisecond
	var (
		batches atomic.Int32
		first   atomic.Int64 // when the first batch ran
	)
	cfg.Rules = []cleanup.Rule{probeRule(func(context.Context, int) (int, error) {
		if batches.Add(1) == 1 {
			first.Store(time.Now().UnixNano())
		}
		return 7, nil // there is always more
	})}
	c := newCleaner(t, drv, cfg)
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep, err := c.RunOnce(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RunOnce cancelled: err = %v; want context.DeadlineExceeded", err)
	}
	stalled := watch.Stop()
	if d := time.Since(start); d > 2*time.Second+stalled {
		t.Errorf("RunOnce returned %s after its start (the process stalled %s); want promptly after the 250ms deadline", d, stalled)
	}
	// A second batch is owed only when the first came early enough for
	// the 100ms pause and another batch before the deadline, the process
	// not stalled meanwhile (taking the lease, or a loaded machine, may
	// take longer than that).
	least := int32(1)
	if n := batches.Load(); n > 0 && time.Unix(0, first.Load()).Sub(start)+stalled < 100*time.Millisecond {
		least = 2
	}
	if n := batches.Load(); n < least || n > 4 || rep.Deleted("probe") != int(n)*7 {
		t.Errorf("%d batches before the deadline (at least %d), report %+v", n, least, rep.Tables)
	}
	if _, _, err := drv.Executor().LockGet(t.Context(), &driver.LockGetParams{Name: cleanup.DefaultLockName}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("lease after a cancelled sweep: err = %v; want released (ErrNotFound)", err)
	}
}

// Finished sagas older than Sagas.TTL are deleted with their steps, in
// batches, oldest first; a finished saga exactly TTL old or younger is kept
// until a later sweep; running, compensating and failed sagas are never
// deleted, however old.
func testCleanupFinishedSagas[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	ex, now := drv.Executor(), t0
	const ttl = 5 * 24 * time.Hour // not the default: the cleaner must use Sagas.TTL
	mk := func(id, state string, at time.Time) {
		fixture.SagaCreate(t, ex, fixture.SagaAt(id, at.Add(-time.Hour)))
		fixture.SagaRecord(t, ex, id, "step-1", driver.StepForward, []byte("r"), at.Add(-time.Minute))
		if state != driver.SagaRunning {
			fixture.SagaSetState(t, ex, id, []string{driver.SagaRunning}, state, at)
		}
	}
	var old, kept, unfinished []string
	for i := range 15 {
		id, state := fmt.Sprintf("old-%d", i), driver.SagaCompleted
		if i%2 == 1 {
			state = driver.SagaCompensated
		}
		mk(id, state, now.Add(-ttl-time.Duration(i+1)*time.Minute))
		old = append(old, id)
	}
	mk("edge", driver.SagaCompleted, now.Add(-ttl)) // exactly TTL old: kept
	mk("young", driver.SagaCompensated, now.Add(-ttl+time.Hour))
	kept = append(kept, "edge", "young")
	for _, state := range []string{driver.SagaRunning, driver.SagaCompensating, driver.SagaFailed} {
		mk("unfinished-"+state, state, now.Add(-100*ttl))
		unfinished = append(unfinished, "unfinished-"+state)
	}
	present := func(when string, ids []string, want bool) {
		t.Helper()
		for _, id := range ids {
			_, err := ex.SagaGet(t.Context(), &driver.SagaGetParams{SagaID: id})
			steps := fixture.SagaSteps(t, ex, id)
			switch {
			case want && (err != nil || len(steps) != 1):
				t.Errorf("%s: saga %s: %v, %d steps; want kept with its step", when, id, err, len(steps))
			case !want && (!errors.Is(err, driver.ErrNotFound) || len(steps) != 0):
				t.Errorf("%s: saga %s: %v, %d steps; want deleted with its steps", when, id, err, len(steps))
			}
		}
	}

	cfg := clConfig(fixedClock(now))
	cfg.Sagas.TTL = ttl
	rep := runOnce(t, newCleaner(t, drv, cfg))
	wantDeleted(t, rep, cleanup.TableSagas, len(old))
	for _, tr := range rep.Tables {
		if tr.Table == cleanup.TableSagas && (tr.Batches != 3 || !tr.Before.Equal(now.Add(-ttl))) {
			t.Errorf("sagas: %d batches before %s; want 3 batches of at most 7 before now - TTL", tr.Batches, tr.Before)
		}
	}
	present("after the first sweep", old, false)
	present("after the first sweep", kept, true)
	present("after the first sweep", unfinished, true)

	// A later sweep deletes the rest of the finished sagas, never the
	// unfinished ones; the sweep can be turned off.
	later := now.Add(ttl + time.Hour)
	cfg = clConfig(fixedClock(later))
	cfg.Sagas.Disabled = true
	cfg.Hold = cleanup.NoHold
	if rep := runOnce(t, newCleaner(t, drv, cfg)); rep.Deleted(cleanup.TableSagas) != 0 {
		t.Errorf("a sweep with Sagas.Disabled deleted %d sagas", rep.Deleted(cleanup.TableSagas))
	}
	present("after a sweep with Sagas.Disabled", kept, true)
	cfg = clConfig(fixedClock(later))
	cfg.Sagas.TTL = ttl
	rep = runOnce(t, newCleaner(t, drv, cfg))
	wantDeleted(t, rep, cleanup.TableSagas, len(kept))
	present("after the later sweep", kept, false)
	present("after the later sweep", unfinished, true)
}

// idemServer is an idemhttp-protected POST /payments whose handler counts
// its executions and answers a body naming the execution.
func idemServer[TTx any](t *testing.T, drv driver.Driver[TTx], cfg *idemhttp.Config) (http.Handler, *atomic.Int64) {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	mw, err := idemhttp.New(drv, cfg)
	if err != nil {
		t.Fatalf("idemhttp.New: %v", err)
	}
	execs := new(atomic.Int64)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := execs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"execution":%d,"pad":"%s"}`, n, strings.Repeat("x", 1000))
	})))
	return mux, execs
}

func post(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return rr
}

// sweepUntil runs sweeps back to back until stop is closed and returns the
// rows they deleted.
func sweepUntil[TTx any](t *testing.T, c *cleanup.Cleaner[TTx], stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		total := 0
		defer func() { out <- total }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rep, err := c.RunOnce(context.Background())
			if err != nil {
				t.Errorf("RunOnce: %v", err)
				return
			}
			total += rep.TotalDeleted()
		}
	}()
	return out
}

func testCleanupReplay[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	h, execs := idemServer(t, drv, &idemhttp.Config{})
	first := post(h, "pay-1")
	if first.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Code, first.Body)
	}
	// Expired records of other clients keep the sweeps busy meanwhile.
	wall := time.Now()
	clRecords(t, drv.Executor(), "expired", 300, wall.Add(-49*time.Hour), wall.Add(-25*time.Hour))

	cfg := clConfig(time.Now)
	cfg.Hold = cleanup.NoHold
	stop := make(chan struct{})
	deleted := sweepUntil(t, newCleaner(t, drv, cfg), stop)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				rr := post(h, "pay-1")
				if rr.Code != first.Code || rr.Body.String() != first.Body.String() || rr.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("replay during a sweep: %d replayed=%q %q; want %d replayed=true %q",
						rr.Code, rr.Header().Get("Idempotent-Replayed"), rr.Body, first.Code, first.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if n := <-deleted; n != 300 {
		t.Errorf("sweeps deleted %d expired records; want 300", n)
	}
	if n := execs.Load(); n != 1 {
		t.Errorf("the handler ran %d times; want once", n)
	}
}

// A record with a 2s lifetime is requested over and over while sweeps run
// back to back: whenever it expires exactly one request executes again, the
// others wait for it and replay it, and no sweep ever deletes the new record.
func testCleanupExpiringReplay[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	const ttl = 2 * time.Second
	h, execs := idemServer(t, drv, &idemhttp.Config{TTL: ttl, TTLOverrideReason: "test of expiry during cleanup", Lease: time.Second})
	cfg := clConfig(time.Now)
	cfg.Hold = cleanup.NoHold
	stop := make(chan struct{})
	deleted := sweepUntil(t, newCleaner(t, drv, cfg), stop)
	const run = 5 * time.Second
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Since(start) < run {
				rr := post(h, "pay-expiring")
				if rr.Code != http.StatusCreated || !strings.HasPrefix(rr.Body.String(), `{"execution":`) {
					t.Errorf("request during sweeps: %d %s", rr.Code, rr.Body)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-deleted
	// One execution per lifetime: at most one at the start and one per
	// expiry (elapsed/ttl), plus one for timing slack.
	elapsed := time.Since(start)
	if n, most := execs.Load(), int64(elapsed/ttl)+2; n < 2 || n > most {
		t.Errorf("the handler ran %d times in %s with a %s record lifetime; want 2..%d", n, elapsed.Round(time.Millisecond), ttl, most)
	}
}

func testCleanupInsertLoad[TTx any](t *testing.T, drv driver.Driver[TTx], _ func() driver.Driver[TTx]) {
	ctx := t.Context()
	wall := time.Now()
	const old = 3000
	fixture.InboxInsert(t, drv.Executor(), consumerA, fixture.NewIDs(t, old), wall.Add(-100*time.Hour))

	cfg := clConfig(time.Now)
	cfg.BatchSize = 100
	cfg.Pause = time.Millisecond
	c := newCleaner(t, drv, cfg)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var inserted, failed atomic.Int64
	fresh := make([][]uuid.UUID, 4)
	for w := range fresh {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ids := fixture.NewIDs(t, 10)
				if err := insertTx(ctx, drv, ids, fmt.Sprintf("load-%d-%d", w, i)); err != nil {
					failed.Add(1)
					t.Errorf("insert during the sweep: %v", err)
					return
				}
				fresh[w] = append(fresh[w], ids...)
				inserted.Add(int64(len(ids)))
			}
		})
	}
	rep, err := c.RunOnce(ctx)
	time.Sleep(50 * time.Millisecond) // some inserts after the sweep too
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("RunOnce under insert load: %v", err)
	}
	wantDeleted(t, rep, cleanup.TableInbox, old)
	if inserted.Load() == 0 || failed.Load() != 0 {
		t.Errorf("%d ids inserted, %d inserts failed during the sweep", inserted.Load(), failed.Load())
	}
	for _, ids := range fresh {
		if got := fixture.InboxInsert(t, drv.Executor(), consumerA, ids, time.Now()); len(got) != 0 {
			t.Errorf("%d fresh inbox rows inserted during the sweep were deleted", len(got))
		}
	}
}

// insertTx records ids in the inbox and claims one idempotency record, in
// one transaction, as a consumer and an HTTP command would.
func insertTx[TTx any](ctx context.Context, drv driver.Driver[TTx], ids []uuid.UUID, key string) error {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = drv.Rollback(context.Background(), tx) }()
	ex, now := drv.UnwrapExecutor(tx), time.Now()
	got, err := ex.InboxInsert(ctx, &driver.InboxInsertParams{Consumer: consumerA, IDs: ids, Now: now})
	if err != nil {
		return fmt.Errorf("InboxInsert: %w", err)
	}
	if len(got) != len(ids) {
		return fmt.Errorf("InboxInsert = %d new; want %d", len(got), len(ids))
	}
	p := claimAt(key, "fp", newToken(), now)
	res, err := ex.RecordClaim(ctx, p)
	if err != nil {
		return fmt.Errorf("RecordClaim(%s): %w", key, err)
	}
	if !res.Claimed {
		return fmt.Errorf("RecordClaim(%s): not claimed", key)
	}
	return drv.Commit(ctx, tx)
}

// claimAt is a record claim of key at now in the suite's scope.
func claimAt(key, fingerprint, token string, now time.Time) *driver.RecordClaimParams {
	return &driver.RecordClaimParams{
		Scope:          testScope,
		Key:            key,
		Fingerprint:    []byte(fingerprint),
		LeaseToken:     token,
		LeaseExpiresAt: now.Add(time.Minute),
		Now:            now,
		ExpiresAt:      now.Add(24 * time.Hour),
	}
}

// newToken returns a fresh lease token.
func newToken() string { return uuid.NewString() }

// mustClaim claims p and fails the test unless that claimed the key.
func mustClaim(t *testing.T, ex driver.Executor, p *driver.RecordClaimParams) {
	t.Helper()
	res, err := ex.RecordClaim(t.Context(), p)
	if err != nil {
		t.Fatalf("RecordClaim(%q): %v", p.Key, err)
	}
	if !res.Claimed {
		t.Fatalf("RecordClaim(%q): not claimed", p.Key)
	}
}

// t0 is the suite's clock origin (an odd instant in an odd zone).
var t0 = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.FixedZone("UTC+05:30", 5*3600+1800))

func mustNotFind(t *testing.T, ex driver.Executor, scope, key string) {
	t.Helper()
	got, err := ex.RecordGet(t.Context(), &driver.RecordGetParams{Scope: scope, Key: key})
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet(%q, %q) = %+v, %v; want ErrNotFound", scope, key, got, err)
	}
}

// Two consumers sharing the inbox table.
const (
	consumerA = "order-projection"
	consumerB = "notifier"
)

// testScope is the scope of the records the tests claim.
const testScope = "tenant-1 POST /payments"

// The cleaner on both idem backends, each with a second replica on the
// same database.
func TestBackends(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		runCleanup(t, func(t *testing.T) driver.Driver[pgx.Tx] { return testdb.Postgres(t) }, pgReplica)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		runCleanup(t, func(t *testing.T) driver.Driver[*sql.Tx] { return testdb.SQLite(t) }, sqliteReplica)
	})
	t.Run("postgres-sql", func(t *testing.T) {
		t.Parallel()
		runCleanup(t, func(t *testing.T) driver.Driver[*sql.Tx] { return testdb.PostgresSQL(t) }, pgsqlReplica)
	})
}

// pgReplica opens a second pool on drv's schema, as a second process would.
func pgReplica(t *testing.T, drv driver.Driver[pgx.Tx]) driver.Driver[pgx.Tx] {
	t.Helper()
	schema := drv.(*pgdriver.Driver).Pool().Config().ConnConfig.RuntimeParams["search_path"]
	r, err := pgdriver.New(testdb.Pool(t, schema, 10), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgdriver.New: %v", err)
	}
	return r
}

// sqliteReplica opens drv's database file a second time, as a second process would.
func sqliteReplica(t *testing.T, drv driver.Driver[*sql.Tx]) driver.Driver[*sql.Tx] {
	t.Helper()
	var seq int
	var name, file string
	if err := drv.(*sqlitedriver.Driver).DB().QueryRowContext(t.Context(), "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		t.Fatalf("PRAGMA database_list: %v", err)
	}
	r, err := sqlitedriver.Open(file, nil)
	if err != nil {
		t.Fatalf("sqlitedriver.Open(%s): %v", file, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}
