package pgsqldriver_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

// CommitComplete reports what happened to the transaction as the driver
// contract (and pgdriver) does: a statement of the handler that failed, or
// a deferred constraint of the handler's table failing at COMMIT, is
// ErrTxAborted (nothing committed; not ErrLeaseLost, which makes idemhttp
// run the handler again); a transaction the handler ended itself is
// ErrTxDone; a key stored meanwhile by a ModeLease claim is ErrLeaseLost.
func TestCommitCompleteErrors(t *testing.T) {
	t.Parallel()
	drv, schema := testdb.PostgresSQLSchema(t)
	ctx := t.Context()
	db := drv.DB()
	for _, q := range []string{
		`CREATE TABLE "` + schema + `".fx (k text PRIMARY KEY)`,
		`CREATE TABLE "` + schema + `".deferred (k text, CONSTRAINT deferred_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(key string) *sql.Tx {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: time.Now()})
		if err != nil || !res.Locked {
			t.Fatalf("BeginClaim(%s) = %+v, %v", key, res, err)
		}
		t.Cleanup(func() { _ = drv.Rollback(context.Background(), tx) })
		return tx
	}
	complete := func(tx *sql.Tx, key string) error {
		return drv.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"),
			Status: 200, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
	}
	noRecord := func(key string) {
		t.Helper()
		if rec, err := drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: key}); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("%s: record after the failed CommitComplete = %+v, %v; want none", key, rec, err)
		}
	}

	tx := claim("ok")
	if _, err := tx.ExecContext(ctx, `INSERT INTO "`+schema+`".fx VALUES ('ok')`); err != nil {
		t.Fatal(err)
	}
	if err := complete(tx, "ok"); err != nil {
		t.Fatalf("CommitComplete: %v", err)
	}

	tx = claim("aborted")
	if _, err := tx.ExecContext(ctx, `INSERT INTO "`+schema+`".fx VALUES ('ok')`); err == nil {
		t.Fatal("a duplicate INSERT succeeded")
	}
	if err := complete(tx, "aborted"); !errors.Is(err, driver.ErrTxAborted) {
		t.Fatalf("CommitComplete of an aborted transaction: %v, want ErrTxAborted", err)
	}
	noRecord("aborted")

	tx = claim("deferred")
	if _, err := tx.ExecContext(ctx, `INSERT INTO "`+schema+`".deferred VALUES ('x'), ('x')`); err != nil {
		t.Fatal(err)
	}
	if err := complete(tx, "deferred"); !errors.Is(err, driver.ErrTxAborted) || errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete with a deferred violation: %v, want ErrTxAborted, not ErrLeaseLost", err)
	}
	noRecord("deferred")

	tx = claim("ended")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := complete(tx, "ended"); !errors.Is(err, driver.ErrTxDone) {
		t.Fatalf("CommitComplete of a transaction rolled back by the handler: %v, want ErrTxDone", err)
	}
	noRecord("ended")

	tx = claim("stolen")
	if _, err := drv.Executor().RecordClaim(ctx, &driver.RecordClaimParams{Scope: "s", Key: "stolen", Fingerprint: []byte("fp"),
		LeaseToken: "other", LeaseExpiresAt: time.Now().Add(time.Minute), Now: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := complete(tx, "stolen"); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete of a key stored by another writer: %v, want ErrLeaseLost", err)
	}
	// The pool is usable afterwards: no connection was left in a failed
	// transaction.
	for range 5 {
		if err := db.QueryRowContext(ctx, `SELECT 1`).Scan(new(int)); err != nil {
			t.Fatal(err)
		}
	}
}
