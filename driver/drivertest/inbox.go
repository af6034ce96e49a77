package drivertest

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/fixture"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// runInbox runs the inbox (processed_event) tests against the backend that
// newDriver builds: InboxInsert returns exactly the ids that are new for the
// consumer (duplicates inside the batch counted once, batches far larger than
// any bound-parameter limit), consumers are independent, a rolled-back insert
// leaves nothing, concurrent duplicates yield exactly one "new" and, on
// backends with concurrent writers, a duplicate waits for the uncommitted
// transaction that inserted the id (also when it comes in a batch of new ids,
// which a backend may record on a faster path that fails on duplicates);
// InboxDeleteBefore deletes only older rows,
// oldest first, at most limit per call; InboxOldest reports the oldest row.
//
// newDriver has the contract of Run's: a fresh, migrated database per call.
func runInbox[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	t.Helper()
	t.Run("Inbox", func(t *testing.T) {
		t.Parallel()
		// Executor-level scenarios, run outside a transaction and inside
		// one that commits.
		for _, sc := range inboxScenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				for _, m := range []string{modeExecutor, modeTxCommit} {
					t.Run(m, func(t *testing.T) {
						t.Parallel()
						runInboxScenario(t, newDriver, m, sc.run)
					})
				}
			})
		}
		tests := []struct {
			name string
			fn   func(t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx])
		}{
			{"RollbackLeavesNothing", testInboxRollback[TTx]},
			{"ConcurrentDuplicatesOneNew", testInboxConcurrentDuplicates[TTx]},
			{"ConcurrentOverlappingBatches", testInboxOverlappingBatches[TTx]},
			{"ConcurrentTx/DuplicateWaitsForCommit", testInboxTxWaitsForCommit[TTx]},
			{"ConcurrentTx/DuplicateInsertsAfterRollback", testInboxTxInsertsAfterRollback[TTx]},
			{"ConcurrentTx/BatchWaitsForCommit", testInboxTxBatchWaitsForCommit[TTx]},
			{"ConcurrentTx/BatchInsertsAfterRollback", testInboxTxBatchInsertsAfterRollback[TTx]},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tt.fn(t, newDriver)
			})
		}
	})
}

type inboxScenario struct {
	name string
	run  func(t *testing.T, ex driver.Executor)
}

var inboxScenarios = []inboxScenario{
	{"InsertReturnsOnlyNewIDs", testInboxInsertNew},
	{"DuplicatesInsideTheBatch", testInboxDuplicatesInBatch},
	{"EmptyBatch", testInboxEmptyBatch},
	{"ConsumersAreIndependent", testInboxConsumers},
	{"LargeBatchOneCall", testInboxLargeBatch},
	{"DeleteBefore", testInboxDeleteBefore},
	{"DeleteBeforeRejectsBadLimit", testInboxDeleteBadLimit},
	{"Oldest", testInboxOldest},
}

// runInboxScenario runs sc through drv.Executor() or inside a transaction; in
// the latter case it commits and checks that every id the transaction
// recorded is a duplicate for everybody afterwards.
func runInboxScenario[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx], m string, sc func(*testing.T, driver.Executor)) {
	drv := newDriver(t)
	if m == modeExecutor {
		sc(t, drv.Executor())
		return
	}
	tx := begin(t, drv)
	tr := &inboxTracker{Executor: drv.UnwrapExecutor(tx)}
	sc(t, tr)
	if t.Failed() {
		return
	}
	commit(t, drv, tx)
	for consumer, ids := range tr.present() {
		if got := fixture.InboxInsert(t, drv.Executor(), consumer, ids, t0); len(got) != 0 {
			t.Errorf("after commit, %d of the %d ids the transaction had recorded for %q are new again: %v", len(got), len(ids), consumer, got)
		}
	}
}

// inboxTracker remembers every (consumer, id) recorded through it, minus
// those deleted, as far as the Executor's results tell.
type inboxTracker struct {
	driver.Executor
	mu   sync.Mutex
	seen map[string]map[uuid.UUID]bool
}

func (tr *inboxTracker) InboxInsert(ctx context.Context, p *driver.InboxInsertParams) ([]uuid.UUID, error) {
	consumer := p.Consumer
	got, err := tr.Executor.InboxInsert(ctx, p)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.seen == nil {
		tr.seen = map[string]map[uuid.UUID]bool{}
	}
	if tr.seen[consumer] == nil {
		tr.seen[consumer] = map[uuid.UUID]bool{}
	}
	for _, id := range got {
		tr.seen[consumer][id] = true
	}
	return got, err
}

func (tr *inboxTracker) InboxDeleteBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error) {
	consumer := p.Consumer
	n, err := tr.Executor.InboxDeleteBefore(ctx, p)
	if n.Deleted > 0 { // which rows went is unknown: stop vouching for this consumer
		tr.mu.Lock()
		if consumer == "" {
			tr.seen = nil
		} else {
			delete(tr.seen, consumer)
		}
		tr.mu.Unlock()
	}
	return n, err
}

func (tr *inboxTracker) present() map[string][]uuid.UUID {
	out := map[string][]uuid.UUID{}
	for c, ids := range tr.seen {
		for id := range ids {
			out[c] = append(out[c], id)
		}
	}
	return out
}

const (
	consumerA = "order-projection"
	consumerB = "notifier"
)

// sameIDs reports whether got holds exactly the ids of want, each once.
func sameIDs(got, want []uuid.UUID) bool {
	cmp := func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) }
	g := slices.SortedFunc(slices.Values(got), cmp)
	w := slices.SortedFunc(slices.Values(want), cmp)
	return slices.Equal(g, w)
}

// mustInsert inserts ids and checks that exactly want came back as new.
func mustInsert(t *testing.T, ex driver.Executor, consumer string, ids, want []uuid.UUID) {
	t.Helper()
	got := fixture.InboxInsert(t, ex, consumer, ids, t0)
	if !sameIDs(got, want) {
		t.Fatalf("InboxInsert(%q, %v) returned %d new ids %v; want exactly %v", consumer, ids, len(got), got, want)
	}
}

func testInboxInsertNew(t *testing.T, ex driver.Executor) {
	ids := fixture.NewIDs(t, 3)
	a, b, c := ids[0], ids[1], ids[2]
	mustInsert(t, ex, consumerA, []uuid.UUID{a, b}, []uuid.UUID{a, b})
	mustInsert(t, ex, consumerA, []uuid.UUID{b, c}, []uuid.UUID{c})
	mustInsert(t, ex, consumerA, []uuid.UUID{c, b, a}, nil)
	mustInsert(t, ex, consumerA, []uuid.UUID{a}, nil)
}

func testInboxDuplicatesInBatch(t *testing.T, ex driver.Executor) {
	ids := fixture.NewIDs(t, 3)
	a, b, c := ids[0], ids[1], ids[2]
	mustInsert(t, ex, consumerA, []uuid.UUID{a, a, b, a, b}, []uuid.UUID{a, b})
	mustInsert(t, ex, consumerA, []uuid.UUID{c, c, a, c}, []uuid.UUID{c})
}

func testInboxEmptyBatch(t *testing.T, ex driver.Executor) {
	for _, ids := range [][]uuid.UUID{nil, {}} {
		if got := fixture.InboxInsert(t, ex, consumerA, ids, t0); len(got) != 0 {
			t.Errorf("InboxInsert(%v) = %v; want nothing", ids, got)
		}
	}
}

// The same event is processed once by each consumer.
func testInboxConsumers(t *testing.T, ex driver.Executor) {
	ids := fixture.NewIDs(t, 2)
	a, b := ids[0], ids[1]
	mustInsert(t, ex, consumerA, []uuid.UUID{a}, []uuid.UUID{a})
	mustInsert(t, ex, consumerB, []uuid.UUID{a}, []uuid.UUID{a})
	mustInsert(t, ex, consumerA, []uuid.UUID{a}, nil)
	mustInsert(t, ex, consumerB, []uuid.UUID{a, b}, []uuid.UUID{b})
	mustInsert(t, ex, consumerA, []uuid.UUID{a, b}, []uuid.UUID{b})
	// The consumer name is one column, compared exactly.
	mustInsert(t, ex, consumerA+" ", []uuid.UUID{a}, []uuid.UUID{a})
	mustInsert(t, ex, "Order-Projection", []uuid.UUID{a}, []uuid.UUID{a})
}

// A batch well past any bound-parameter or chunk limit is one call with an
// exact answer, also when old and new ids are mixed in random order.
func testInboxLargeBatch(t *testing.T, ex driver.Executor) {
	const n = 2500
	old := fixture.NewIDs(t, n)
	mustInsert(t, ex, consumerA, old, old)
	fresh := fixture.NewIDs(t, n)
	mixed := slices.Concat(old, fresh, fresh[:100])
	rand.Shuffle(len(mixed), func(i, j int) { mixed[i], mixed[j] = mixed[j], mixed[i] })
	mustInsert(t, ex, consumerA, mixed, fresh)
	mustInsert(t, ex, consumerA, mixed, nil)
}

// InboxDeleteBefore deletes exactly the rows processed before the cutoff,
// oldest first, at most limit per call, of one consumer or of all.
func testInboxDeleteBefore(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	cutoff := t0
	at := []time.Duration{-72 * time.Hour, -25 * time.Hour, -2 * time.Hour, -time.Microsecond, 0, time.Microsecond, time.Hour}
	const older = 4 // processed strictly before the cutoff
	ids := map[string][]uuid.UUID{}
	for _, consumer := range []string{consumerA, consumerB} {
		ids[consumer] = fixture.NewIDs(t, len(at))
		for i, d := range at {
			id := ids[consumer][i]
			if got := fixture.InboxInsert(t, ex, consumer, []uuid.UUID{id}, cutoff.Add(d)); !sameIDs(got, []uuid.UUID{id}) {
				t.Fatalf("InboxInsert(%q, %s) = %v; want it new", consumer, id, got)
			}
		}
	}

	// Consumer A only, two at a time: 2, 2, then none.
	for call, want := range []int{2, 2, 0} {
		res, err := ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: consumerA, Before: cutoff, Limit: 2})
		if err != nil || res.Deleted != want {
			t.Fatalf("InboxDeleteBefore(%q, cutoff, 2) call %d = %d, %v; want %d", consumerA, call+1, res.Deleted, err, want)
		}
	}
	// The oldest went first: A's older rows are new again, the rest are not.
	for i, d := range at {
		id := ids[consumerA][i]
		got := fixture.InboxInsert(t, ex, consumerA, []uuid.UUID{id}, cutoff.Add(d))
		if deleted := i < older; len(got) == 1 != deleted {
			t.Errorf("consumer A's row processed at cutoff%+v: deleted=%v; want %v", d, len(got) == 1, deleted)
		}
	}
	// B was untouched: all of its ids are still duplicates.
	if got := fixture.InboxInsert(t, ex, consumerB, ids[consumerB], cutoff); len(got) != 0 {
		t.Errorf("deleting consumer A's rows deleted %d of consumer B's", len(got))
	}

	// "" is every consumer: A's re-inserted older rows and B's older rows.
	res, err := ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: "", Before: cutoff, Limit: 100})
	if err != nil || res.Deleted != 2*older {
		t.Fatalf(`InboxDeleteBefore("", cutoff, 100) = %d, %v; want %d`, res.Deleted, err, 2*older)
	}
	res, err = ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: "", Before: cutoff, Limit: 100})
	if err != nil || res.Deleted != 0 {
		t.Fatalf(`second InboxDeleteBefore("", cutoff, 100) = %d, %v; want 0`, res.Deleted, err)
	}
	// Rows at or after the cutoff remain, for both consumers.
	for _, consumer := range []string{consumerA, consumerB} {
		if got := fixture.InboxInsert(t, ex, consumer, ids[consumer][older:], cutoff); len(got) != 0 {
			t.Errorf("%s: rows processed at or after the cutoff were deleted: %v", consumer, got)
		}
	}
	// An unknown consumer deletes nothing.
	if res, err := ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: "nobody", Before: cutoff.Add(24 * time.Hour), Limit: 100}); err != nil || res.Deleted != 0 {
		t.Errorf("InboxDeleteBefore(nobody) = %d, %v; want 0", res.Deleted, err)
	}
}

func testInboxDeleteBadLimit(t *testing.T, ex driver.Executor) {
	for _, limit := range []int{0, -1} {
		if _, err := ex.InboxDeleteBefore(t.Context(), &driver.InboxDeleteBeforeParams{Consumer: "", Before: t0, Limit: limit}); err == nil {
			t.Errorf("InboxDeleteBefore with limit %d succeeded; want an error", limit)
		}
	}
}

func testInboxOldest(t *testing.T, ex driver.Executor) {
	ctx := t.Context()
	if ts, ok, err := ex.InboxOldest(ctx); err != nil || ok {
		t.Fatalf("InboxOldest on an empty table = %s, %v, %v; want false", ts, ok, err)
	}
	// Nanoseconds are dropped, the instant (in another zone) is kept.
	oldest := time.Date(2031, 7, 1, 23, 59, 59, 999_999_999, time.FixedZone("UTC-09:30", -(9*3600+1800)))
	ids := fixture.NewIDs(t, 3)
	fixture.InboxInsert(t, ex, consumerA, ids[:1], oldest.Add(time.Hour))
	fixture.InboxInsert(t, ex, consumerB, ids[1:2], oldest)
	fixture.InboxInsert(t, ex, consumerA, ids[2:], oldest.Add(48*time.Hour))
	ts, ok, err := ex.InboxOldest(ctx)
	if err != nil || !ok {
		t.Fatalf("InboxOldest = %s, %v, %v", ts, ok, err)
	}
	if d := ts.Sub(oldest).Abs(); d >= time.Microsecond {
		t.Errorf("InboxOldest = %s; want %s to the microsecond", ts, oldest)
	}
}

// Ids recorded in a transaction that rolls back are new again; in a
// transaction that commits, they are duplicates. A transaction sees its own
// inserts.
func testInboxRollback[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ids := fixture.NewIDs(t, 3)
	tx := begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx), consumerA, ids, ids)
	mustInsert(t, drv.UnwrapExecutor(tx), consumerA, ids, nil)
	rollback(t, drv, tx)
	mustInsert(t, drv.Executor(), consumerA, ids[:1], ids[:1])

	tx = begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx), consumerA, ids, ids[1:])
	commit(t, drv, tx)
	mustInsert(t, drv.Executor(), consumerA, ids, nil)
	if _, ok, err := drv.Executor().InboxOldest(t.Context()); err != nil || !ok {
		t.Errorf("InboxOldest after commit = %v, %v; want a row", ok, err)
	}
}

// duplicates callers insert the same id at once: exactly one gets it back.
func testInboxConcurrentDuplicates[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	for round := range 3 {
		id := fixture.NewIDs(t, 1)[0]
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
			errs []error
		)
		start := make(chan struct{})
		for range duplicates {
			wg.Go(func() {
				<-start
				got, err := drv.Executor().InboxInsert(t.Context(), &driver.InboxInsertParams{Consumer: consumerA, IDs: []uuid.UUID{id}, Now: t0})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				wins += len(got)
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %d inserts failed, first: %v", round, len(errs), errs[0])
		}
		if wins != 1 {
			t.Fatalf("round %d: %d concurrent inserts of one id: %d saw it new; want exactly 1", round, duplicates, wins)
		}
	}
}

// Transactions recording overlapping batches in opposite orders neither
// deadlock nor both apply an event: every id is new for exactly one of them.
// (Unsorted, two such batches lock rows in crossing orders and PostgreSQL
// aborts one of them with a deadlock.)
func testInboxOverlappingBatches[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	const (
		workers = 6
		rounds  = 5
		size    = 200
	)
	for round := range rounds {
		all := fixture.NewIDs(t, size)
		wins := make(map[uuid.UUID]int, size)
		var (
			mu   sync.Mutex
			errs []error
		)
		record := func(got []uuid.UUID, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, id := range got {
				wins[id]++
			}
		}
		batches := make([][]uuid.UUID, workers)
		for w := range batches {
			r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
			b := slices.Clone(all)
			switch w % 3 {
			case 0: // input order
			case 1:
				slices.Reverse(b)
			case 2:
				r.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
			}
			batches[w] = b
		}
		if drv.Caps().ConcurrentWriters {
			// Every transaction is open before any of them inserts, so
			// the inserts really run at the same time.
			var ready, wg sync.WaitGroup
			start := make(chan struct{})
			for _, b := range batches {
				ready.Add(1)
				wg.Go(func() {
					tx, err := drv.Begin(t.Context())
					ready.Done()
					if err != nil {
						record(nil, err)
						return
					}
					<-start
					got, err := drv.UnwrapExecutor(tx).InboxInsert(t.Context(), &driver.InboxInsertParams{Consumer: consumerA, IDs: b, Now: t0})
					if err != nil {
						_ = drv.Rollback(t.Context(), tx)
						record(nil, err)
						return
					}
					record(got, drv.Commit(t.Context(), tx))
				})
			}
			ready.Wait()
			close(start)
			wg.Wait()
		} else {
			var wg sync.WaitGroup
			for _, b := range batches {
				wg.Go(func() { record(inboxInsertTx(t.Context(), drv, b)) })
			}
			wg.Wait()
		}
		if len(errs) > 0 {
			t.Fatalf("round %d: %d of %d overlapping batch transactions failed, first: %v", round, len(errs), workers, errs[0])
		}
		if len(wins) != size {
			t.Errorf("round %d: %d of %d ids were new for some transaction; want all", round, len(wins), size)
		}
		for id, n := range wins {
			if n != 1 {
				t.Errorf("round %d: id %s was new for %d transactions; want 1", round, id, n)
			}
		}
		mustInsert(t, drv.Executor(), consumerA, all, nil)
	}
}

// inboxInsertTx records ids in its own transaction.
func inboxInsertTx[TTx any](ctx context.Context, drv driver.Driver[TTx], ids []uuid.UUID) ([]uuid.UUID, error) {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return nil, err
	}
	got, err := drv.UnwrapExecutor(tx).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: consumerA, IDs: ids, Now: t0})
	if err != nil {
		_ = drv.Rollback(ctx, tx)
		return nil, err
	}
	return got, drv.Commit(ctx, tx)
}

type inboxOutcome struct {
	got []uuid.UUID
	err error
}

func inboxInsertInBackground(ctx context.Context, ex driver.Executor, id uuid.UUID) <-chan inboxOutcome {
	return inboxBatchInBackground(ctx, ex, []uuid.UUID{id})
}

func inboxBatchInBackground(ctx context.Context, ex driver.Executor, ids []uuid.UUID) <-chan inboxOutcome {
	done := make(chan inboxOutcome, 1)
	go func() {
		got, err := ex.InboxInsert(ctx, &driver.InboxInsertParams{Consumer: consumerA, IDs: ids, Now: t0})
		done <- inboxOutcome{got, err}
	}()
	return done
}

func inboxMustBlock(t *testing.T, done <-chan inboxOutcome) {
	t.Helper()
	select {
	case o := <-done:
		t.Fatalf("duplicate insert returned %v, %v while the first transaction was still open; want it to wait", o.got, o.err)
	case <-time.After(blockWait):
	}
}

func inboxMustFinish(t *testing.T, done <-chan inboxOutcome) []uuid.UUID {
	t.Helper()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("duplicate insert: %v", o.err)
		}
		return o.got
	case <-time.After(settleWait):
		t.Fatalf("duplicate insert still blocked %s after the first transaction ended", settleWait)
	}
	return nil
}

// A duplicate of an id that an open transaction recorded waits for it, in a
// transaction or not; once it commits, the id is not new. Another consumer
// does not wait.
func testInboxTxWaitsForCommit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	id := fixture.NewIDs(t, 1)[0]
	tx1 := begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx1), consumerA, []uuid.UUID{id}, []uuid.UUID{id})

	inTx := inboxInsertInBackground(t.Context(), drv.UnwrapExecutor(begin(t, drv)), id)
	outside := inboxInsertInBackground(t.Context(), drv.Executor(), id)
	inboxMustBlock(t, inTx)
	inboxMustBlock(t, outside)
	mustInsert(t, drv.Executor(), consumerB, []uuid.UUID{id}, []uuid.UUID{id})

	commit(t, drv, tx1)
	if got := inboxMustFinish(t, inTx); len(got) != 0 {
		t.Errorf("in a transaction: after the first transaction committed, the duplicate saw the id new")
	}
	if got := inboxMustFinish(t, outside); len(got) != 0 {
		t.Errorf("outside a transaction: after the first transaction committed, the duplicate saw the id new")
	}
}

// If the transaction that recorded the id rolls back, the waiting duplicate
// records it.
func testInboxTxInsertsAfterRollback[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	id := fixture.NewIDs(t, 1)[0]
	tx1 := begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx1), consumerA, []uuid.UUID{id}, []uuid.UUID{id})
	tx2 := begin(t, drv)
	done := inboxInsertInBackground(t.Context(), drv.UnwrapExecutor(tx2), id)
	inboxMustBlock(t, done)
	rollback(t, drv, tx1)
	if got := inboxMustFinish(t, done); !sameIDs(got, []uuid.UUID{id}) {
		t.Fatalf("after the first transaction rolled back, the waiting duplicate got %v; want the id new", got)
	}
	commit(t, drv, tx2)
	mustInsert(t, drv.Executor(), consumerA, []uuid.UUID{id}, nil)
}

// inboxContestedBatch returns a batch of fresh ids with contested among
// them (in the middle of the sorted batch, after ids that a plain INSERT
// would already have written).
func inboxContestedBatch(t *testing.T, contested uuid.UUID) []uuid.UUID {
	t.Helper()
	fresh := fixture.NewIDs(t, 40)
	slices.SortFunc(fresh, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	batch := slices.Concat(fresh[:20], []uuid.UUID{contested}, fresh[20:])
	slices.SortFunc(batch, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return batch
}

// A batch of fresh ids that contains an id an open transaction recorded
// waits for it, in a transaction or not; once it commits, the batch gets
// exactly its other ids back, and a transaction that recorded it goes on.
func testInboxTxBatchWaitsForCommit[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	id := fixture.NewIDs(t, 1)[0]
	tx1 := begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx1), consumerA, []uuid.UUID{id}, []uuid.UUID{id})

	inBatch := inboxContestedBatch(t, id)
	outBatch := inboxContestedBatch(t, id)
	tx2 := begin(t, drv)
	inTx := inboxBatchInBackground(t.Context(), drv.UnwrapExecutor(tx2), inBatch)
	outside := inboxBatchInBackground(t.Context(), drv.Executor(), outBatch)
	inboxMustBlock(t, inTx)
	inboxMustBlock(t, outside)

	commit(t, drv, tx1)
	without := func(b []uuid.UUID) []uuid.UUID {
		return slices.DeleteFunc(slices.Clone(b), func(x uuid.UUID) bool { return x == id })
	}
	if got := inboxMustFinish(t, inTx); !sameIDs(got, without(inBatch)) {
		t.Errorf("in a transaction: after the first transaction committed, the batch got %d new ids; want its %d others", len(got), len(inBatch)-1)
	}
	if got := inboxMustFinish(t, outside); !sameIDs(got, without(outBatch)) {
		t.Errorf("outside a transaction: after the first transaction committed, the batch got %d new ids; want its %d others", len(got), len(outBatch)-1)
	}
	// tx2 goes on: it records more, commits, and all of it stays.
	more := fixture.NewIDs(t, 20)
	mustInsert(t, drv.UnwrapExecutor(tx2), consumerA, slices.Concat(more, inBatch), more)
	commit(t, drv, tx2)
	mustInsert(t, drv.Executor(), consumerA, slices.Concat(inBatch, outBatch, more), nil)
}

// If the transaction that recorded the id rolls back, the waiting batch
// records all of its ids.
func testInboxTxBatchInsertsAfterRollback[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	requireConcurrentWriters(t, drv)
	id := fixture.NewIDs(t, 1)[0]
	tx1 := begin(t, drv)
	mustInsert(t, drv.UnwrapExecutor(tx1), consumerA, []uuid.UUID{id}, []uuid.UUID{id})
	batch := inboxContestedBatch(t, id)
	tx2 := begin(t, drv)
	done := inboxBatchInBackground(t.Context(), drv.UnwrapExecutor(tx2), batch)
	inboxMustBlock(t, done)
	rollback(t, drv, tx1)
	if got := inboxMustFinish(t, done); !sameIDs(got, batch) {
		t.Fatalf("after the first transaction rolled back, the waiting batch got %d new ids; want all %d", len(got), len(batch))
	}
	commit(t, drv, tx2)
	mustInsert(t, drv.Executor(), consumerA, batch, nil)
}
