package saga_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// BenchmarkStepTxPostgres measures one transaction (BEGIN, StepTx, COMMIT)
// recording a new step of a running saga, with a result and without.
func BenchmarkStepTxPostgres(b *testing.B) {
	testdb.RequirePostgres(b)
	ctx := context.Background()
	pool, schema := testdb.Schema(b, 4)
	drv := pgDriver(b, pool, schema)
	if err := drv.Migrate(ctx); err != nil {
		b.Fatalf("Migrate: %v", err)
	}
	c, err := saga.New(drv, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		result []byte
	}{{"Result", []byte("charge-1")}, {"NoResult", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			id := newSagaID(b)
			tx, err := drv.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = drv.Rollback(ctx, tx) }()
			if _, _, err := c.StartTx(ctx, tx, id, "bench", nil); err != nil {
				b.Fatal(err)
			}
			if err := drv.Commit(ctx, tx); err != nil {
				b.Fatal(err)
			}
			fn := func(context.Context, pgx.Tx) ([]byte, error) { return tc.result, nil }
			i := 0
			for b.Loop() {
				i++
				tx, err := drv.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, ran, err := c.StepTx(ctx, tx, id, fmt.Sprintf("step-%d", i), fn); err != nil || !ran {
					_ = drv.Rollback(ctx, tx)
					b.Fatalf("StepTx = ran %v, %v", ran, err)
				}
				if err := drv.Commit(ctx, tx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
