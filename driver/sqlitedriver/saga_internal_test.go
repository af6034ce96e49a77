package sqlitedriver

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/driver"
)

// A recovery loop's SagaList of unfinished states (compensating, failed)
// reads the index of unfinished sagas, not the whole table, which holds
// every finished saga of the retention (72h of them by default), on the
// first page and on the next ones; a list that includes finished states
// still finds them.
func TestSagaListReadsUnfinishedIndex(t *testing.T) {
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	db := d.DB()
	for _, q := range []string{
		`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000)
			INSERT INTO saga (saga_id, saga_type, state, created_at, updated_at, finished_at)
			SELECT printf('done-%05d', n), 'order', 'completed', 0, n, n FROM g`,
		`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 4)
			INSERT INTO saga (saga_id, saga_type, state, created_at, updated_at)
			SELECT 'open-' || n, 'order', CASE WHEN n % 2 = 0 THEN 'failed' ELSE 'compensating' END, 0, 100 - n FROM g`,
		`ANALYZE`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	unfinished := []string{driver.SagaCompensating, driver.SagaFailed}
	for _, after := range []any{nil, "open-4"} {
		rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+d.expand(sagaListQuery(unfinished)), jsonStrings(unfinished), 2, 96, after)
		if err != nil {
			t.Fatal(err)
		}
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
		_ = rows.Close()
		if p := plan.String(); !strings.Contains(p, "saga_unfinished_idx") || strings.Contains(p, "SCAN saga\n") {
			t.Errorf("SagaList(compensating, failed) after %v does not read saga_unfinished_idx:\n%s", after, p)
		}
	}
	list := func(limit int, states ...string) []string {
		t.Helper()
		p := &driver.SagaListParams{States: states, Limit: limit}
		var ids []string
		for {
			page, err := d.Executor().SagaList(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range page {
				ids = append(ids, s.ID)
			}
			if len(page) < p.Limit {
				return ids
			}
			p.AfterID, p.AfterUpdatedAt = page[len(page)-1].ID, page[len(page)-1].UpdatedAt
		}
	}
	if got, want := list(2, unfinished...), []string{"open-4", "open-3", "open-2", "open-1"}; !slices.Equal(got, want) {
		t.Errorf("SagaList(compensating, failed), paged = %v; want %v", got, want)
	}
	if got := list(1000, driver.SagaFailed, driver.SagaCompleted); len(got) != 5002 || got[0] != "done-00001" || !slices.Contains(got, "open-2") || slices.Contains(got, "open-1") {
		t.Errorf("SagaList(failed, completed), paged = %d sagas starting %v; want the 5000 completed and 2 failed ones", len(got), got[:min(len(got), 3)])
	}
}
