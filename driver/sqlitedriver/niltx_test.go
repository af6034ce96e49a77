package sqlitedriver_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

// The executor of a nil *sql.Tx (a transaction not threaded through to
// outbox.EnqueueTx, saga.StartTx, ...) refuses every statement. It used to
// run the driver's prepared statements on the database, each committed on
// its own, apart from the business write the caller meant them to join.
func TestUnwrapExecutorOfNilTxWritesNothing(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ex := drv.UnwrapExecutor(nil)
	ctx := t.Context()
	now := time.Now()
	if n, err := ex.OutboxInsert(ctx, []driver.OutboxRow{outboxRow()}); err == nil {
		t.Errorf("OutboxInsert of a nil tx = %d, nil; want an error", n)
	}
	if _, _, err := drv.SagasTx(nil).SagaCreate(ctx, &driver.Saga{
		ID: "s-1", Type: "t", State: driver.SagaRunning, CreatedAt: now, UpdatedAt: now,
	}); err == nil {
		t.Error("SagaCreate of a nil tx succeeded; want an error")
	}
	id := outboxRow().EventID
	if _, err := drv.InboxTx(nil).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "c", IDs: []uuid.UUID{id}, Now: now}); err == nil {
		t.Error("InboxInsert of a nil tx succeeded; want an error")
	}
	if got, err := drv.Inbox().InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "c", IDs: []uuid.UUID{id}, Now: now}); err != nil || len(got) != 1 {
		t.Errorf("the inbox already holds the event (InboxInsert = %v, %v); want it new", got, err)
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(ctx); err != nil || ok {
		t.Errorf("an event is stored (%v, %v); want none", ok, err)
	}
	if _, err := drv.Sagas().SagaGet(ctx, &driver.SagaGetParams{SagaID: "s-1"}); err == nil {
		t.Error("a saga is stored; want none")
	}
}
