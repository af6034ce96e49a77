package drivertest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// PostgresDriver is what IsolationChecked needs of a PostgreSQL driver.
type PostgresDriver[TTx any] interface {
	driver.Driver[TTx]
	driver.TxClaimer[TTx]
	Validate(ctx context.Context) error
}

// IsolationChecked checks that a PostgreSQL driver on a single connection,
// migrated, refuses a default isolation level other than READ COMMITTED in
// Validate, in the record claim and in the relay's claim, with an error
// that names the level and what idem needs; and runs again once the level
// is reset. exec runs a statement on that connection.
func IsolationChecked[TTx any](t *testing.T, drv PostgresDriver[TTx], exec func(ctx context.Context, sql string) error) {
	t.Helper()
	ctx := t.Context()
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate under read committed: %v", err)
	}
	for _, level := range []string{"repeatable read", "serializable"} {
		if err := exec(ctx, `SET default_transaction_isolation = '`+level+`'`); err != nil {
			t.Fatal(err)
		}
		refused := func(what string, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), `"`+level+`"`) || !strings.Contains(err.Error(), "need read committed") {
				t.Fatalf("%s under %s: %v; want the isolation level refused", what, level, err)
			}
		}
		refused("Validate", drv.Validate(ctx))
		_, _, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Now: time.Now()})
		refused("BeginClaim", err)
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = drv.UnwrapExecutor(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 10})
		refused("OutboxClaimBatch", err)
		if err := drv.Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	if err := exec(ctx, `RESET default_transaction_isolation`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatalf("Validate under read committed again: %v", err)
	}
	tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Now: time.Now()})
	if err != nil || !res.Locked {
		t.Fatalf("BeginClaim under read committed = %+v, %v", res, err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
}
