package drivertest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/fixture"
)

// runRetention runs the keyset tests of the four retention deletes
// (RecordDeleteExpired, InboxDeleteBefore, OutboxDeletePublishedBefore,
// SagaDeleteFinishedBefore; see driver.DeleteResult) against the backend
// that newDriver builds: a sweep whose batches each pass the Last of the
// batch before as After deletes every eligible row exactly once, in the
// order of the cursor, across groups of rows that share their time value
// and that a batch boundary cuts; Last is the key of the batch's last row;
// a row that becomes eligible behind the cursor during the sweep is left
// for the next sweep, which starts from the zero cursor; rows that are not
// eligible are never deleted.
func runRetention[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	t.Helper()
	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		t.Run("Records", func(t *testing.T) {
			t.Parallel()
			testKeysetSweep(t, newDriver(t), recordKeyset[TTx]())
		})
		t.Run("Inbox", func(t *testing.T) {
			t.Parallel()
			testKeysetSweep(t, newDriver(t), inboxKeyset[TTx]())
		})
		t.Run("Outbox", func(t *testing.T) {
			t.Parallel()
			testKeysetSweep(t, newDriver(t), outboxKeyset[TTx]())
		})
		t.Run("Sagas", func(t *testing.T) {
			t.Parallel()
			testKeysetSweep(t, newDriver(t), sagaKeyset[TTx]())
		})
	})
}

// keysetTable is one retention delete under test, with cursor type C.
type keysetTable[TTx, C any] struct {
	// put stores n rows whose retention time is at, in an order of its
	// own (not the cursor's), and returns their keys. tag makes the keys
	// of one call distinct from those of the others.
	put func(t *testing.T, drv driver.Driver[TTx], tag string, n int, at time.Time) []C
	// del runs one batch: rows older than cutoff (for records: expired at
	// cutoff).
	del func(ctx context.Context, ex driver.Executor, cutoff time.Time, limit int, after C) (driver.DeleteResult[C], error)
	// cmp orders two keys as the delete does (the keys put makes compare
	// alike under every PostgreSQL collation: fixed-width lower-case
	// letters and digits).
	cmp func(a, b C) int
}

// testKeysetSweep sweeps 13 eligible rows in batches of 3: three groups of
// rows sharing one time value (7, 5 and 1 rows), so that batch boundaries
// fall inside the first two; plus two rows younger than the cutoff.
func testKeysetSweep[TTx, C any](t *testing.T, drv driver.Driver[TTx], tb keysetTable[TTx, C]) {
	ctx, ex := t.Context(), drv.Executor()
	cutoff := t0
	var eligible []C
	for i, g := range []struct {
		n  int
		at time.Time
	}{{7, cutoff.Add(-3 * time.Hour)}, {5, cutoff.Add(-2 * time.Hour)}, {1, cutoff.Add(-time.Hour)}} {
		eligible = append(eligible, tb.put(t, drv, fmt.Sprintf("g%d", i), g.n, g.at)...)
	}
	const young = 2
	tb.put(t, drv, "young", young, cutoff.Add(time.Hour))
	slices.SortFunc(eligible, tb.cmp)

	const limit = 3
	var after, zero C
	deleted := 0
	for batch := 0; ; batch++ {
		if batch > len(eligible)/limit+1 {
			t.Fatalf("sweep still deleting after %d batches of %d (%d eligible rows)", batch, limit, len(eligible))
		}
		res, err := tb.del(ctx, ex, cutoff, limit, after)
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		want := min(limit, len(eligible)-deleted)
		if res.Deleted != want {
			t.Fatalf("batch %d after %v: deleted %d; want %d (%d of %d eligible rows deleted before it)",
				batch, after, res.Deleted, want, deleted, len(eligible))
		}
		if want == 0 {
			if tb.cmp(res.Last, after) != 0 {
				t.Errorf("batch %d deleted nothing: Last = %v; want its After %v", batch, res.Last, after)
			}
			break
		}
		deleted += res.Deleted
		if wantLast := eligible[deleted-1]; tb.cmp(res.Last, wantLast) != 0 {
			t.Fatalf("batch %d after %v: Last = %v; want %v, the key of the %d-th eligible row in cursor order",
				batch, after, res.Last, wantLast, deleted)
		}
		after = res.Last
		if batch == 0 {
			// Eligible behind the cursor from now on: this sweep leaves
			// it, the next one deletes it.
			tb.put(t, drv, "behind", 1, cutoff.Add(-4*time.Hour))
		}
		if res.Deleted < limit {
			break
		}
	}
	if deleted != len(eligible) {
		t.Errorf("the sweep deleted %d rows; want the %d eligible ones", deleted, len(eligible))
	}

	// The next sweep starts from the zero cursor: the row put behind the
	// cursor, nothing else.
	if res, err := tb.del(ctx, ex, cutoff, 100, zero); err != nil || res.Deleted != 1 {
		t.Errorf("next sweep = %d, %v; want 1 (the row put behind the cursor)", res.Deleted, err)
	}
	// The young rows are all there.
	if res, err := tb.del(ctx, ex, cutoff.Add(2*time.Hour), 100, zero); err != nil || res.Deleted != young {
		t.Errorf("a sweep past the young rows = %d, %v; want %d", res.Deleted, err, young)
	}
}

// shuffled returns 0..n-1 in a random order.
func shuffled(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	rand.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// recordKeyset is idempotency_record; the rows of a pair share their key in
// two scopes.
func recordKeyset[TTx any]() keysetTable[TTx, driver.RecordCursor] {
	return keysetTable[TTx, driver.RecordCursor]{
		put: func(t *testing.T, drv driver.Driver[TTx], tag string, n int, at time.Time) []driver.RecordCursor {
			keys := make([]driver.RecordCursor, n)
			for _, i := range shuffled(n) {
				p := claimAt(fmt.Sprintf("%sk%03d", tag, i/2), fpA, newToken(), at.Add(-recordTTL))
				p.Scope = []string{"sa", "sb"}[i%2]
				p.ExpiresAt = at
				mustClaim(t, drv.Executor(), p)
				keys[i] = driver.RecordCursor{ExpiresAt: at, Scope: p.Scope, Key: p.Key}
			}
			return keys
		},
		del: func(ctx context.Context, ex driver.Executor, cutoff time.Time, limit int, after driver.RecordCursor) (driver.DeleteResult[driver.RecordCursor], error) {
			// Records expire at or before Now: expired before the cutoff.
			return ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: cutoff.Add(-time.Microsecond), Limit: limit, After: after})
		},
		cmp: func(a, b driver.RecordCursor) int {
			return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
		},
	}
}

// inboxKeyset is processed_event; the rows of a pair are one event of two
// consumers.
func inboxKeyset[TTx any]() keysetTable[TTx, driver.InboxCursor] {
	return keysetTable[TTx, driver.InboxCursor]{
		put: func(t *testing.T, drv driver.Driver[TTx], _ string, n int, at time.Time) []driver.InboxCursor {
			ids := fixture.NewIDs(t, (n+1)/2)
			keys := make([]driver.InboxCursor, n)
			for _, i := range shuffled(n) {
				k := driver.InboxCursor{ProcessedAt: at, Consumer: []string{"ca", "cb"}[i%2], EventID: ids[i/2]}
				if got := fixture.InboxInsert(t, drv.Executor(), k.Consumer, []uuid.UUID{k.EventID}, at); len(got) != 1 {
					t.Fatalf("InboxInsert(%q, %s): not new", k.Consumer, k.EventID)
				}
				keys[i] = k
			}
			return keys
		},
		del: func(ctx context.Context, ex driver.Executor, cutoff time.Time, limit int, after driver.InboxCursor) (driver.DeleteResult[driver.InboxCursor], error) {
			return ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Before: cutoff, Limit: limit, After: after})
		},
		cmp: func(a, b driver.InboxCursor) int {
			return cmp.Or(a.ProcessedAt.Compare(b.ProcessedAt), cmp.Compare(a.Consumer, b.Consumer), bytes.Compare(a.EventID[:], b.EventID[:]))
		},
	}
}

// outboxKeyset is the published outbox rows.
func outboxKeyset[TTx any]() keysetTable[TTx, driver.OutboxCursor] {
	return keysetTable[TTx, driver.OutboxCursor]{
		put: func(t *testing.T, drv driver.Driver[TTx], tag string, n int, at time.Time) []driver.OutboxCursor {
			in := make([]driver.OutboxRow, n)
			for i := range in {
				in[i] = obRow(t, fmt.Sprintf("%s-%d", tag, i), 1, t0)
			}
			rows := obStored(t, drv, in...)
			keys := make([]driver.OutboxCursor, n)
			for _, i := range shuffled(n) {
				if err := drv.Executor().OutboxMarkPublished(t.Context(), &driver.OutboxMarkPublishedParams{IDs: []int64{rows[i].ID}, At: at}); err != nil {
					t.Fatalf("OutboxMarkPublished: %v", err)
				}
				keys[i] = driver.OutboxCursor{PublishedAt: at, ID: rows[i].ID}
			}
			return keys
		},
		del: func(ctx context.Context, ex driver.Executor, cutoff time.Time, limit int, after driver.OutboxCursor) (driver.DeleteResult[driver.OutboxCursor], error) {
			return ex.OutboxDeletePublishedBefore(ctx, &driver.OutboxDeletePublishedBeforeParams{Before: cutoff, Limit: limit, After: after})
		},
		cmp: func(a, b driver.OutboxCursor) int {
			return cmp.Or(a.PublishedAt.Compare(b.PublishedAt), cmp.Compare(a.ID, b.ID))
		},
	}
}

// sagaKeyset is the finished sagas.
func sagaKeyset[TTx any]() keysetTable[TTx, driver.SagaCursor] {
	return keysetTable[TTx, driver.SagaCursor]{
		put: func(t *testing.T, drv driver.Driver[TTx], tag string, n int, at time.Time) []driver.SagaCursor {
			ex := drv.Executor()
			keys := make([]driver.SagaCursor, n)
			for _, i := range shuffled(n) {
				id := fmt.Sprintf("%ss%03d", tag, i)
				fixture.SagaCreate(t, ex, fixture.SagaAt(id, at.Add(-time.Hour)))
				fixture.SagaSetState(t, ex, id, []string{driver.SagaRunning}, []string{driver.SagaCompleted, driver.SagaCompensated}[i%2], at)
				keys[i] = driver.SagaCursor{FinishedAt: at, SagaID: id}
			}
			return keys
		},
		del: func(ctx context.Context, ex driver.Executor, cutoff time.Time, limit int, after driver.SagaCursor) (driver.DeleteResult[driver.SagaCursor], error) {
			return ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: cutoff, Limit: limit, After: after})
		},
		cmp: func(a, b driver.SagaCursor) int {
			return cmp.Or(a.FinishedAt.Compare(b.FinishedAt), cmp.Compare(a.SagaID, b.SagaID))
		},
	}
}
