package drivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// A statement of a transaction cancelled by its own context (a deadline
// shorter than the transaction's) leaves the transaction all or nothing. A
// backend may keep the transaction going without the statement (it was
// cancelled before it started), or lose the whole transaction (PostgreSQL
// aborts it; SQLite rolls it back when a write is interrupted): then the
// statements that follow must fail and Commit must fail, with nothing of
// the transaction committed. What must never happen is the SQLite failure
// this guards: the statements after the cancelled one committed one by one
// outside the transaction, without the ones before it.
//
// The deadline falls at a different moment of a long multi-statement write
// in each round, so that some rounds cancel a statement as it runs.
func testCancelledStatement[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	ex := drv.Executor()
	now := time.Now().UTC()
	batch := make([]driver.OutboxRow, 5000)
	payload := []byte(`{"amount":1}`)
	for i, timeout := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond, 16 * time.Millisecond, 32 * time.Millisecond} {
		for j := range batch {
			batch[j] = driver.OutboxRow{
				EventID: uuid.Must(uuid.NewV7()), EventType: "Test.Happened.v1", Key: fmt.Sprintf("k-%d", j%50),
				OccurredAt: now, Payload: payload, CreatedAt: now,
			}
		}
		before := claimAt(fmt.Sprintf("before-%d", i), fpA, newToken(), t0)
		after := claimAt(fmt.Sprintf("after-%d", i), fpA, newToken(), t0)

		tx := begin(t, drv)
		mustClaim(t, drv.UnwrapExecutor(tx), before)
		short, cancel := context.WithTimeout(ctx, timeout)
		_, insertErr := drv.UnwrapExecutor(tx).OutboxInsert(short, batch)
		cancel()
		_, afterErr := drv.UnwrapExecutor(tx).RecordClaim(ctx, after)
		commitErr := drv.Commit(ctx, tx)
		if commitErr != nil {
			_ = drv.Rollback(context.Background(), tx)
		}

		_, errBefore := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: testScope, Key: before.Key})
		_, errAfter := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: testScope, Key: after.Key})
		for _, err := range []error{errBefore, errAfter} {
			if err != nil && !errors.Is(err, driver.ErrNotFound) {
				t.Fatalf("RecordGet: %v", err)
			}
		}
		beforeIn, afterIn := errBefore == nil, errAfter == nil
		round := fmt.Sprintf("round %d (deadline %s; insert: %v; claim after it: %v; Commit: %v)", i, timeout, insertErr, afterErr, commitErr)
		switch {
		case commitErr == nil && (!beforeIn || !afterIn || afterErr != nil):
			t.Errorf("%s: Commit succeeded, yet the claim before the cancelled statement is committed: %v, the one after it: %v", round, beforeIn, afterIn)
		case commitErr != nil && (beforeIn || afterIn):
			t.Errorf("%s: Commit failed, yet the claim before the cancelled statement is committed: %v, the one after it: %v; want neither", round, beforeIn, afterIn)
		}
		if t.Failed() {
			return
		}
	}
	// The database is usable afterwards.
	mustClaim(t, ex, claimAt("later", fpA, newToken(), t0))
	tx := begin(t, drv)
	mustClaim(t, drv.UnwrapExecutor(tx), claimAt("later-tx", fpA, newToken(), t0))
	commit(t, drv, tx)
}
