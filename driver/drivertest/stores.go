package drivertest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// testStores checks the per-table accessors that the components use
// (Records, Inbox, Outbox, Sagas, Locks and their ...Tx forms): each one
// reaches its table, the ...Tx form writes in the caller's transaction and
// nothing of it is visible outside before the commit.
func testStores[TTx any](t *testing.T, newDriver func(t *testing.T) driver.Driver[TTx]) {
	drv := newDriver(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)

	if _, err := drv.Records().RecordGet(ctx, &driver.RecordGetParams{Scope: testScope, Key: "none"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Records().RecordGet of a missing key: %v; want ErrNotFound", err)
	}
	if _, err := drv.Sagas().SagaGet(ctx, &driver.SagaGetParams{SagaID: "none"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Sagas().SagaGet of a missing saga: %v; want ErrNotFound", err)
	}
	if _, _, err := drv.Locks().LockGet(ctx, &driver.LockGetParams{Name: "none"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Locks().LockGet of a missing lease: %v; want ErrNotFound", err)
	}

	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	if got, err := drv.InboxTx(tx).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "stores", IDs: []uuid.UUID{id}, Now: now}); err != nil || len(got) != 1 {
		t.Fatalf("InboxTx(tx).InboxInsert = %v, %v; want the id", got, err)
	}
	if n, err := drv.OutboxTx(tx).OutboxInsert(ctx, []driver.OutboxRow{{EventID: id, EventType: "t", Key: "k", OccurredAt: now, Payload: []byte("{}"), CreatedAt: now}}); err != nil || n != 1 {
		t.Fatalf("OutboxTx(tx).OutboxInsert = %d, %v; want 1", n, err)
	}
	if _, created, err := drv.SagasTx(tx).SagaCreate(ctx, &driver.Saga{ID: "stores", Type: "t", State: driver.SagaRunning, CreatedAt: now, UpdatedAt: now}); err != nil || !created {
		t.Fatalf("SagasTx(tx).SagaCreate = %v, %v; want created", created, err)
	}
	res, err := drv.RecordsTx(tx).RecordClaim(ctx, claimAt("stores", "fp", newToken(), now))
	if err != nil || !res.Claimed {
		t.Fatalf("RecordsTx(tx).RecordClaim = %+v, %v; want claimed", res, err)
	}
	if drv.Caps().ConcurrentWriters {
		// Outside the transaction, before its commit, nothing is visible.
		if _, ok, err := drv.Outbox().OutboxOldestUnpublished(ctx); err != nil || ok {
			t.Fatalf("Outbox() sees an uncommitted row: %v, %v", ok, err)
		}
		if _, err := drv.Sagas().SagaGet(ctx, &driver.SagaGetParams{SagaID: "stores"}); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("Sagas() sees an uncommitted saga: %v", err)
		}
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := drv.Inbox().InboxOldest(ctx); err != nil || !ok {
		t.Fatalf("Inbox().InboxOldest after the commit = %v, %v; want a row", ok, err)
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(ctx); err != nil || !ok {
		t.Fatalf("Outbox().OutboxOldestUnpublished after the commit = %v, %v; want a row", ok, err)
	}
	if _, err := drv.Sagas().SagaGet(ctx, &driver.SagaGetParams{SagaID: "stores"}); err != nil {
		t.Fatalf("Sagas().SagaGet after the commit: %v", err)
	}
	if _, err := drv.Records().RecordGet(ctx, &driver.RecordGetParams{Scope: testScope, Key: "stores"}); err != nil {
		t.Fatalf("Records().RecordGet after the commit: %v", err)
	}
}
