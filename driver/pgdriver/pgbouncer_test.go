package pgdriver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// TestBehindPgBouncer runs its subtests through one PgBouncer in
// transaction pooling mode (each PgBouncer takes connection slots of the
// tests' for as long as it runs: see testdb.PgBouncer).
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncer(t)
	t.Run("ValidateDetects", func(t *testing.T) { behindPgBouncerValidateDetects(t, bouncer) })
	t.Run("ClaimsLeaveNoLock", func(t *testing.T) { behindPgBouncerClaimsLeaveNoLock(t, bouncer) })
	t.Run("Driver", func(t *testing.T) { behindPgBouncerDriver(t, bouncer) })
	t.Run("ListenOutbox", func(t *testing.T) { behindPgBouncerListenOutbox(t, bouncer) })
	t.Run("UnlockRefusedTurnsToTransactionLocks", func(t *testing.T) { behindPgBouncerUnlockRefusedTurnsToTransactionLocks(t, bouncer) })
}

// Behind PgBouncer in transaction pooling mode a client's statements
// outside a transaction may each run on another server session, so a
// session-level advisory lock taken by one statement may be held by a
// session the next statement is not on: its unlock then fails, and the
// lock stays with a server connection that PgBouncer hands to other
// clients. The driver must notice the pooler and keep every lock inside a
// transaction. Rolled-back claims (a handler that failed) must leave no
// lock behind, and their retries must get the key.
func behindPgBouncerClaimsLeaveNoLock(t *testing.T, bouncer string) {
	t.Parallel()
	drv, _ := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
	ctx := t.Context()
	direct := testdb.Postgres(t).Pool()

	stopChurn := testdb.Churn(t, drv.Pool()) // PgBouncer moves this client between server connections
	const n = 60
	claim := func(i int) (pgx.Tx, *driver.TxClaimResult) {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: fmt.Sprint("k", i), Now: time.Now()})
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		return tx, res
	}
	for i := range n {
		tx, res := claim(i)
		if !res.Locked {
			t.Fatalf("claim %d of a new key: not locked", i)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if err := drv.Rollback(ctx, tx); err != nil {
			t.Fatalf("rollback %d: %v", i, err)
		}
	}
	stopChurn()

	held := 0
	for i := range n {
		lock := drv.RecordLockKey("s", fmt.Sprint("k", i))
		var granted int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`,
			lock).Scan(&granted); err != nil {
			t.Fatal(err)
		}
		held += granted
	}
	if held > 0 {
		t.Errorf("%d of %d rolled-back claims left their key's advisory lock held by a server connection of PgBouncer", held, n)
	}
	refused := 0
	for i := range n {
		tx, res := claim(i)
		if !res.Locked {
			refused++
			continue
		}
		if err := drv.Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	if refused > 0 {
		t.Errorf("%d of %d retries of a rolled-back claim found the key locked (by no one alive)", refused, n)
	}
}

// The driver's whole shared suite through PgBouncer in transaction
// pooling mode.
func behindPgBouncerDriver(t *testing.T, bouncer string) {
	t.Parallel()
	drivertest.Run(t, drivertest.Backend[pgx.Tx]{
		New: func(t *testing.T) driver.Driver[pgx.Tx] {
			drv, _ := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
			return drv
		},
		NewUnmigrated: func(t *testing.T) driver.Driver[pgx.Tx] {
			_, schema := testdb.Schema(t, 2)
			drv, err := pgdriver.New(testdb.BouncerPool(t, bouncer, 10), &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return drv
		},
	})
}

// LISTEN through PgBouncer in transaction mode would never be woken (a
// notification reaches a client only while it runs a transaction):
// ListenOutbox refuses it with errors.ErrUnsupported (the relay then polls
// and says so), and listens on Config.ListenConnConfig, a direct
// connection, when given one; enqueues through PgBouncer wake it.
func behindPgBouncerListenOutbox(t *testing.T, bouncer string) {
	t.Parallel()
	ctx := t.Context()
	drv, schema := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
	if _, err := drv.ListenOutbox(ctx, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ListenOutbox through PgBouncer without ListenConnConfig: %v; want an error wrapping errors.ErrUnsupported", err)
	}
	direct, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	listening, err := pgdriver.New(drv.Pool(), &pgdriver.Config{Schema: schema, ListenConnConfig: direct})
	if err != nil {
		t.Fatal(err)
	}
	wake, err := listening.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListenOutbox on a direct ListenConnConfig: %v", err)
	}
	select { // the signal of the first connection
	case <-wake:
	case <-time.After(5 * time.Second):
	}
	enqueue(t, drv, newEvent(t, "k", 1))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("an enqueue through PgBouncer did not wake the listener on the direct connection")
	}
	forced, err := pgdriver.New(testdb.Postgres(t).Pool(), &pgdriver.Config{TransactionPooling: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := forced.ListenOutbox(ctx, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("ListenOutbox with Config.TransactionPooling and no ListenConnConfig: %v; want errors.ErrUnsupported", err)
	}
}

// A pooler that the first claim's check misses (one that passes the
// server's process ID on): the first unlock that finds its lock in another
// session turns the driver's claims to transaction-scoped locks.
func behindPgBouncerUnlockRefusedTurnsToTransactionLocks(t *testing.T, bouncer string) {
	t.Parallel()
	drv, _ := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
	ctx := t.Context()
	claim := func(key string) {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Locked {
			t.Fatalf("claim of the new key %s: not locked", key)
		}
		if err := drv.Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	claim("first") // the detection
	if !drv.TransactionPooling() {
		t.Fatal("the first claim through PgBouncer did not detect the pooler")
	}
	direct := testdb.Postgres(t)
	tx, _, err := direct.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "direct", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if direct.TransactionPooling() {
		t.Fatal("a claim on a direct connection detected a pooler")
	}
	drv.ForgetPooled()
	testdb.Churn(t, drv.Pool())
	for i := range 200 {
		claim(fmt.Sprint("k", i))
		if drv.TransactionPooling() {
			return
		}
	}
	t.Error("200 claims through PgBouncer, and no unlock was found refused")
}

// Validate (idemd runs it at start-up) tells a pool through PgBouncer from
// a direct one, before any claim.
func behindPgBouncerValidateDetects(t *testing.T, bouncer string) {
	t.Parallel()
	ctx := t.Context()
	migrated, schema := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
	drv, err := pgdriver.New(migrated.Pool(), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Validate(ctx); err != nil {
		t.Fatal(err)
	}
	if !drv.TransactionPooling() {
		t.Error("Validate through PgBouncer did not detect the pooler")
	}
	direct := testdb.Postgres(t)
	if err := direct.Validate(ctx); err != nil {
		t.Fatal(err)
	}
	if direct.TransactionPooling() {
		t.Error("Validate on a direct pool detected a pooler")
	}
}
