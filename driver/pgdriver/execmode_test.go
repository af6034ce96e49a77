package pgdriver_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// The uuid[] arguments of InboxInsert, OutboxInsert and OutboxUnpark (and
// the latter's NULLs) are encoded in every pgx query execution mode: the
// simple protocol and QueryExecModeExec (a pool behind PgBouncer's
// transaction pooling) find the array's type from its Go type alone,
// without the server's description of the statement.
func TestUUIDArraysInEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			drv := driverInExecMode(t, mode)
			ctx := t.Context()

			tx, err := drv.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			ids := inboxIDs(t, 20)
			mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", ids[:10], ids[:10])                    // plain INSERT
			mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", slices.Concat(ids[5:], ids), ids[10:]) // ON CONFLICT
			mustInboxInsert(t, drv.UnwrapExecutor(tx), "c", ids[:1], nil)                          // one id: ON CONFLICT

			now := time.Now().UTC().Truncate(time.Microsecond)
			rows := make([]driver.OutboxRow, 3)
			for i := range rows {
				rows[i] = driver.OutboxRow{EventID: ids[i], EventType: "t.v1", Key: "k", OccurredAt: now, Payload: []byte(`{}`), CreatedAt: now}
			}
			if n, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, rows); err != nil || n != len(rows) {
				t.Fatalf("OutboxInsert: %d, %v; want %d", n, err, len(rows))
			}
			if err := drv.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}

			// OutboxUnpark's arguments, uuid[] and NULLs among them.
			var id int64
			if err := drv.Pool().QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, ids[0]).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if err := drv.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: id, Error: "poison", At: now}); err != nil {
				t.Fatal(err)
			}
			for _, tt := range []struct {
				p    driver.OutboxUnparkParams
				want int
			}{
				{driver.OutboxUnparkParams{Keys: []string{"k"}, ParkedBefore: now, Limit: 10}, 0},
				{driver.OutboxUnparkParams{EventIDs: ids[:2], Limit: 2}, 1},
				{driver.OutboxUnparkParams{Limit: 10}, 0},
			} {
				if n, err := drv.Executor().OutboxUnpark(ctx, &tt.p); err != nil || n != tt.want {
					t.Errorf("OutboxUnpark(%+v) = %d, %v; want %d", tt.p, n, err, tt.want)
				}
			}
		})
	}
}

// A saga step is recorded, and found recorded, in every pgx query
// execution mode: SagaStepInsertSQL uses its parameters in a data-modifying
// CTE and again in the locking query, and none has a type but the one the
// server infers.
func TestSagaStepInEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			drv := driverInExecMode(t, mode)
			ctx := t.Context()
			if err := drv.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC().Truncate(time.Microsecond)
			if _, _, err := drv.Sagas().SagaCreate(ctx, &driver.Saga{ID: "s", Type: "t", State: driver.SagaRunning, CreatedAt: now, UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
			for _, savepoint := range []bool{true, false} {
				step := "step-savepoint"
				if !savepoint {
					step = "step-plain"
				}
				tx, err := drv.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				ex := drv.SagasTx(tx)
				p := &driver.SagaStepRecordParams{SagaID: "s", Step: step, Kind: driver.StepForward, Now: now, Savepoint: savepoint}
				if ok, _, err := ex.SagaStepRecord(ctx, p); err != nil || !ok {
					t.Fatalf("SagaStepRecord(%s) = %v, %v; want inserted", step, ok, err)
				}
				if savepoint {
					err = ex.SagaStepEnd(ctx, &driver.SagaStepEndParams{SagaID: "s", Step: step, Result: []byte("r")})
				} else {
					err = ex.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: "s", Step: step, Result: []byte("r")})
				}
				if err != nil {
					t.Fatalf("storing the result of %s: %v", step, err)
				}
				if err := drv.Commit(ctx, tx); err != nil {
					t.Fatal(err)
				}
				if ok, res, err := drv.Sagas().SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "s", Step: step, Kind: driver.StepForward, Now: now}); err != nil || ok || string(res) != "r" {
					t.Fatalf("SagaStepRecord(%s) again = %v, %q, %v; want the recorded result", step, ok, res, err)
				}
			}
			if _, _, err := drv.Sagas().SagaStepRecord(ctx, &driver.SagaStepRecordParams{SagaID: "s", Step: "c", Kind: driver.StepCompensation, Now: now}); !errors.Is(err, driver.ErrSagaState) {
				t.Fatalf("compensation of a running saga: %v; want ErrSagaState", err)
			}
		})
	}
}

// execModes are every pgx query execution mode.
var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// driverInExecMode returns a migrated driver on a fresh schema whose pool
// (2 connections) runs its queries in mode.
func driverInExecMode(t *testing.T, mode pgx.QueryExecMode) *pgdriver.Driver {
	t.Helper()
	_, schema := testdb.Schema(t, 2)
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return newDriver(t, pool, &pgdriver.Config{Schema: schema})
}
