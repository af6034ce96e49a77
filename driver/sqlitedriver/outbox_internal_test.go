package sqlitedriver

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// OutboxCountParked reads the index of the unpublished rows that failed,
// not the outbox, however many rows are pending; an event unparked with
// the runbook's statement (docs/operations.md) leaves the count at once.
func TestOutboxCountParkedReadsTheFailedRows(t *testing.T) {
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	db := d.DB()
	if _, err := db.ExecContext(ctx, `WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000)
		INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
		SELECT printf('00000000-0000-4000-8000-%012d', n), 'Test.Happened.v1', 'k' || (n % 500), x'7b7d', 0, 0 FROM g`); err != nil {
		t.Fatal(err)
	}
	var parked []uuid.UUID
	for range 3 {
		id := uuid.New()
		parked = append(parked, id)
		n, err := d.Executor().OutboxInsert(ctx, []driver.OutboxRow{{EventID: id, EventType: "Test.Happened.v1", Key: "p" + id.String(),
			Payload: []byte(`{}`), OccurredAt: time.Now(), CreatedAt: time.Now()}})
		if err != nil || n != 1 {
			t.Fatalf("OutboxInsert = %d, %v", n, err)
		}
		var rowID int64
		if err := db.QueryRowContext(ctx, `SELECT id FROM outbox WHERE event_id = ?`, id.String()).Scan(&rowID); err != nil {
			t.Fatal(err)
		}
		if err := d.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: rowID, Error: "poison", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	explain := func(query string, args ...any) string {
		t.Helper()
		rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+d.expand(query), args...)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rows.Close() }()
		var plan strings.Builder
		for rows.Next() {
			var (
				id, parent, unused int
				detail             string
			)
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(detail + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return plan.String()
	}
	usesBlocked := func(plan string) bool {
		return (strings.Contains(plan, "USING INDEX outbox_blocked_idx") || strings.Contains(plan, "USING COVERING INDEX outbox_blocked_idx")) &&
			!strings.Contains(plan, "SCAN outbox\n")
	}
	if plan := explain(outboxCountParkedSQL); !usesBlocked(plan) {
		t.Errorf("the count of parked rows does not read outbox_blocked_idx:\n%s", plan)
	}
	// So do the latest park time and the unpark, whatever it selects by;
	// the unpark in the index's order, so that a batch reads its own rows
	// and not every parked row (in ID order, each batch sorted them all:
	// unparking 200,000 events took 22 s).
	if plan := explain(outboxLastParkedSQL); !usesBlocked(plan) {
		t.Errorf("the latest park time does not read outbox_blocked_idx:\n%s", plan)
	}
	for _, args := range [][]any{{nil, nil, nil, 1000}, {int64(1), nil, nil, 1000}, {int64(1), `["` + parked[0].String() + `"]`, `["k1"]`, 1}} {
		if plan := explain(outboxUnparkSQL, args...); !usesBlocked(plan) || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("the unpark of %v does not read outbox_blocked_idx in its order:\n%s", args, plan)
		}
	}
	// So does OutboxRetryNow.
	if plan := explain(outboxRetryNowSQL, int64(1), 1000); !usesBlocked(plan) {
		t.Errorf("OutboxRetryNow does not read outbox_blocked_idx:\n%s", plan)
	}
	// The latest publication time is the last entry of its index.
	if plan := explain(outboxLastPublishedSQL); !strings.Contains(plan, "USING COVERING INDEX outbox_published_at_idx") {
		t.Errorf("the latest publication time does not read outbox_published_at_idx:\n%s", plan)
	}
	count := func(want int) {
		t.Helper()
		if n, err := d.Executor().OutboxCountParked(ctx); err != nil || n != want {
			t.Fatalf("OutboxCountParked = %d, %v; want %d", n, err, want)
		}
	}
	count(3)
	if _, err := db.ExecContext(ctx, `UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = NULL WHERE event_id = ?`,
		parked[1].String()); err != nil {
		t.Fatal(err)
	}
	count(2)
	if n, err := d.Executor().OutboxUnpark(ctx, &driver.OutboxUnparkParams{EventIDs: parked[:1], Limit: 1}); err != nil || n != 1 {
		t.Fatalf("OutboxUnpark = %d, %v; want 1", n, err)
	}
	count(1)
}

// A parked event blocks its key, whose later events pile up behind it for
// as long as it stays parked: a claim costs the same whether that backlog
// holds 5,000 events or none (each claim used to read the whole backlog
// before the claimable events after it: 0.5 s a claim for 200,000). The
// claim still returns exactly the other keys' events, and after the unpark
// the parked event then its backlog, in order.
func TestOutboxClaimSkipsTheBacklogOfAParkedKey(t *testing.T) {
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	db := d.DB()
	ex := d.Executor()
	insert := func(key string, n, from int) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `WITH RECURSIVE g(n) AS (SELECT ?3 UNION ALL SELECT n + 1 FROM g WHERE n < ?3 + ?2 - 1)
			INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			SELECT printf('00000000-0000-4000-8000-%012d', n), 'Test.Happened.v1',
				CASE WHEN ?1 = '' THEN 'k' || n ELSE ?1 END, x'7b7d', 0, 0 FROM g`, key, n, from); err != nil {
			t.Fatal(err)
		}
	}
	insert("hot", 1, 1)
	var head int64
	if err := db.QueryRowContext(ctx, `SELECT id FROM outbox WHERE record_key = 'hot'`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if err := ex.OutboxPark(ctx, &driver.OutboxParkParams{ID: head, Error: "poison", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// The key's events enqueued while it is parked, as the relay's
	// callers enqueue them.
	const backlog, others = 5000, 100
	var rows []driver.OutboxRow
	for range backlog {
		rows = append(rows, driver.OutboxRow{EventID: uuid.New(), EventType: "Test.Happened.v1", Key: "hot",
			Payload: []byte(`{}`), OccurredAt: time.Now(), CreatedAt: time.Now()})
	}
	if n, err := ex.OutboxInsert(ctx, rows); err != nil || n != backlog {
		t.Fatalf("OutboxInsert = %d, %v", n, err)
	}
	insert("", others, backlog+2)
	if _, err := db.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	claim := func(limit int) ([]driver.OutboxRow, time.Duration) {
		t.Helper()
		var (
			rows  []driver.OutboxRow
			times []time.Duration
		)
		// The fastest of 9: other processes' load (CI, parallel tests)
		// only ever adds time, and a claim that reads the backlog is slow
		// every time.
		for range 9 {
			start := time.Now()
			var err error
			rows, err = ex.OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: limit})
			times = append(times, time.Since(start))
			if err != nil {
				t.Fatal(err)
			}
		}
		return rows, slices.Min(times)
	}
	claimed, withBacklog := claim(others)
	if len(claimed) != others || slices.ContainsFunc(claimed, func(r driver.OutboxRow) bool { return r.Key == "hot" }) {
		t.Fatalf("claim behind a parked key: %d rows (hot ones: %v); want the %d of the other keys", len(claimed),
			slices.ContainsFunc(claimed, func(r driver.OutboxRow) bool { return r.Key == "hot" }), others)
	}
	// The same claim with no backlog behind the parked event.
	if _, err := db.ExecContext(ctx, `DELETE FROM outbox WHERE record_key = 'hot' AND id <> ?`, head); err != nil {
		t.Fatal(err)
	}
	_, without := claim(others)
	t.Logf("claim of %d rows: %s behind a parked key with %d events, %s without", others, withBacklog, backlog, without)
	if withBacklog > 3*without+time.Millisecond {
		t.Errorf("a claim takes %s behind a parked key with %d events, %s without: it reads the backlog", withBacklog, backlog, without)
	}
	// Unparked, the key's backlog is claimed again, in order.
	insert("hot", 500, backlog+others+2)
	if n, err := ex.OutboxUnpark(ctx, &driver.OutboxUnparkParams{Keys: []string{"hot"}, Limit: 10}); err != nil || n != 1 {
		t.Fatalf("OutboxUnpark = %d, %v; want 1", n, err)
	}
	claimed, _ = claim(others + 600)
	var hot []int64
	for _, r := range claimed {
		if r.Key == "hot" {
			hot = append(hot, r.ID)
		}
	}
	if len(claimed) != others+501 || len(hot) != 501 || hot[0] != head || !slices.IsSorted(hot) {
		t.Errorf("claim after the unpark: %d rows, %d of the key (first %v); want %d, the parked one first then its backlog in order",
			len(claimed), len(hot), hot[:min(len(hot), 1)], others+501)
	}
}
