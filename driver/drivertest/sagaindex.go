package drivertest

import (
	"context"
	"slices"
	"testing"

	"github.com/idemkit/idem/driver"
)

// SagaListReadsUnfinishedIndex checks that a PostgreSQL driver's SagaList
// of unfinished states (what a recovery loop lists: compensating, failed)
// reads the partial index of unfinished sagas, saga_unfinished_idx, and
// not the whole saga table, which holds every finished saga of the
// retention (72h of them by default); on the first page and on the next
// ones (AfterID). drv must be migrated with no table prefix and its
// tables on the search_path; query runs sql in tx and scans its one row
// into dest (with no dest, it only runs it). Nothing is committed.
func SagaListReadsUnfinishedIndex[TTx any](t *testing.T, drv driver.Driver[TTx], query func(ctx context.Context, tx TTx, sql string, dest ...any) error) {
	t.Helper()
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Rollback(context.WithoutCancel(ctx), tx) }()
	for _, q := range []string{
		`INSERT INTO saga (saga_id, saga_type, state, created_at, updated_at, finished_at)
			SELECT 'done-' || lpad(g::text, 5, '0'), 'order', 'completed', now(), now(), now() FROM generate_series(1, 5000) g`,
		`INSERT INTO saga (saga_id, saga_type, state, created_at, updated_at)
			SELECT 'open-' || g, 'order', CASE WHEN g % 2 = 0 THEN 'failed' ELSE 'compensating' END, now(), now() - g * interval '1 minute'
			FROM generate_series(1, 4) g`,
		`ANALYZE saga`,
	} {
		if err := query(ctx, tx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	scans := func() (seq, idx int64) {
		t.Helper()
		if err := query(ctx, tx, `SELECT coalesce((SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'saga'::regclass), 0),
			pg_stat_get_xact_numscans('saga_unfinished_idx'::regclass)`, &seq, &idx); err != nil {
			t.Fatal(err)
		}
		return seq, idx
	}
	ex := drv.SagasTx(tx)
	p := &driver.SagaListParams{States: []string{driver.SagaCompensating, driver.SagaFailed}, Limit: 2}
	var got []string
	for page := 1; ; page++ {
		seq0, idx0 := scans()
		list, err := ex.SagaList(ctx, p)
		if err != nil {
			t.Fatalf("SagaList page %d: %v", page, err)
		}
		seq1, idx1 := scans()
		if seq1 != seq0 || idx1 == idx0 {
			t.Errorf("SagaList(compensating, failed) page %d: %d sequential scans of saga and %d of saga_unfinished_idx; want none and at least one: it reads every finished saga",
				page, seq1-seq0, idx1-idx0)
		}
		for _, s := range list {
			got = append(got, s.ID)
		}
		if len(list) < p.Limit {
			break
		}
		last := list[len(list)-1]
		p.AfterID, p.AfterUpdatedAt = last.ID, last.UpdatedAt
	}
	if want := []string{"open-4", "open-3", "open-2", "open-1"}; !slices.Equal(got, want) {
		t.Errorf("SagaList(compensating, failed), paged = %v; want %v", got, want)
	}
}
