package sqlitedriver_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
)

// endlessInsert writes rows until its context interrupts it.
const endlessInsert = `INSERT INTO acct (v) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c`

// claimWait is the Wait of the tests' claims that are not about the wait:
// with none, BeginClaim waits only a few milliseconds for the single
// connection, which the driver's background preparation of the statements
// first met in a transaction may hold; on a loaded machine that runs out,
// and the claim is not locked.
const claimWait = 5 * time.Second

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func outboxRow() driver.OutboxRow {
	now := time.Now()
	return driver.OutboxRow{
		EventID: uuid.Must(uuid.NewV7()), EventType: "payment.captured", Key: "acct-1",
		OccurredAt: now, Payload: []byte(`{}`), CreatedAt: now,
	}
}

// A statement of a transaction interrupted by its own, shorter, context
// makes SQLite roll the whole transaction back. The statements that follow
// in the *sql.Tx must fail instead of running (and committing) one by one
// outside any transaction, and Commit must fail: nothing of the transaction
// is committed. The connection then works as before.
func TestInterruptedStatementLeavesNothingCommitted(t *testing.T) {
	t.Parallel()
	t.Run("Open", func(t *testing.T) {
		t.Parallel()
		testInterrupted(t, testdb.SQLite(t))
	})
	// A *sql.DB of the application's, opened with DSN, has the guard too.
	t.Run("NewWithDSN", func(t *testing.T) {
		t.Parallel()
		db, err := sql.Open("sqlite", sqlitedriver.DSN(testdb.SQLitePath(t), 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		db.SetMaxOpenConns(1)
		drv, err := sqlitedriver.New(db, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = drv.Close() })
		migrate(t, drv)
		testInterrupted(t, drv)
	})
}

func testInterrupted(t *testing.T, drv *sqlitedriver.Driver) {
	ctx := t.Context()
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE acct (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}

	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err != nil {
		t.Fatalf("insert 1: %v", err)
	}
	// Long enough for the statement to start even on a loaded machine: a
	// context that ends before it does fails it without running it, and
	// the transaction rightly goes on.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = tx.ExecContext(short, endlessInsert)
	cancel()
	if err == nil {
		t.Fatal("the endless insert succeeded")
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (2, 2)`); err == nil {
		t.Error("insert 2 after the interrupted statement succeeded; want an error")
	} else {
		t.Logf("insert 2: %v", err)
	}
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{outboxRow()}); err == nil {
		t.Error("OutboxInsert after the interrupted statement succeeded; want an error")
	} else if !errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("OutboxInsert: %v; want driver.ErrTxAborted (nothing committed)", err)
	}
	if err := drv.Commit(ctx, tx); err == nil {
		t.Error("Commit succeeded; want an error")
	} else if !errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("Commit: %v; want driver.ErrTxAborted (nothing committed, not an unknown outcome)", err)
	}
	if n := count(t, db, "acct"); n != 0 {
		t.Errorf("%d acct rows committed; want none", n)
	}
	if n := count(t, db, "outbox"); n != 0 {
		t.Errorf("%d outbox rows committed; want none", n)
	}

	// The connection is usable: outside a transaction statements commit
	// as before, and a later transaction commits.
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (3, 3)`); err != nil {
		t.Fatalf("autocommit insert afterwards: %v", err)
	}
	if _, err := drv.Executor().OutboxInsert(ctx, []driver.OutboxRow{outboxRow()}); err != nil {
		t.Fatalf("autocommit OutboxInsert afterwards: %v", err)
	}
	tx, err = drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (4, 4)`); err != nil {
		t.Fatalf("insert 4: %v", err)
	}
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{outboxRow()}); err != nil {
		t.Fatalf("OutboxInsert: %v", err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if n := count(t, db, "acct"); n != 2 {
		t.Errorf("%d acct rows; want 2", n)
	}
	if n := count(t, db, "outbox"); n != 2 {
		t.Errorf("%d outbox rows; want 2", n)
	}
}

// The guard leaves alone what does not end the transaction: a failed
// statement (its own changes undone), a savepoint rolled back to, a failed
// statement outside a transaction.
func TestTxGuardKeepsOrdinaryFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.SQLite(t)
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE acct (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err == nil {
		t.Fatal("duplicate insert outside a transaction succeeded")
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (2, 2)`); err != nil {
		t.Fatalf("insert after a failed one outside a transaction: %v", err)
	}

	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	steps := []struct {
		sql     string
		wantErr bool
	}{
		{`INSERT INTO acct VALUES (3, 3)`, false},
		{`INSERT INTO acct VALUES (1, 1)`, true}, // the statement fails, the transaction goes on
		{`SAVEPOINT sp`, false},
		{`INSERT INTO acct VALUES (4, 4)`, false},
		{`ROLLBACK TO sp`, false},
		{`RELEASE sp`, false},
		{`INSERT INTO acct VALUES (5, 5)`, false},
	}
	for _, s := range steps {
		if _, err := tx.ExecContext(ctx, s.sql); (err != nil) != s.wantErr {
			t.Fatalf("%s: %v (want error: %v)", s.sql, err, s.wantErr)
		}
	}
	// A read interrupted by its context leaves the transaction open.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = tx.ExecContext(short, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c`)
	cancel()
	if err == nil {
		t.Fatal("the endless read succeeded")
	}
	if _, err := drv.UnwrapExecutor(tx).OutboxInsert(ctx, []driver.OutboxRow{outboxRow()}); err != nil {
		t.Fatalf("OutboxInsert: %v", err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if n := count(t, db, "acct"); n != 4 {
		t.Errorf("%d acct rows; want 4 (1, 2, 3, 5)", n)
	}
	if n := count(t, db, "outbox"); n != 1 {
		t.Errorf("%d outbox rows; want 1", n)
	}

	// A transaction rolled back by its caller leaves the connection as
	// it was.
	tx, err = drv.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (6, 6)`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (7, 7)`); err != nil {
		t.Fatalf("insert after a rollback: %v", err)
	}
	if n := count(t, db, "acct"); n != 5 {
		t.Errorf("%d acct rows; want 5", n)
	}
}

// A Begin that fails (another process holds the write lock past the busy
// timeout) leaves the connection outside any transaction, unguarded:
// statements there fail and commit as usual.
func TestTxGuardAfterFailedBegin(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := testdb.SQLitePath(t)
	holder := open(t, path, nil)
	migrate(t, holder)
	if _, err := holder.DB().ExecContext(ctx, `CREATE TABLE acct (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	other := open(t, path, &sqlitedriver.Config{BusyTimeout: time.Millisecond})
	if _, err := other.DB().ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err != nil {
		t.Fatal(err)
	}

	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if _, err := other.Begin(ctx); !errors.Is(err, driver.ErrLockTimeout) {
		t.Fatalf("Begin while another holds the write lock: %v; want ErrLockTimeout", err)
	}
	if err := holder.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.DB().ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err == nil {
		t.Fatal("duplicate insert succeeded")
	}
	if _, err := other.DB().ExecContext(ctx, `INSERT INTO acct VALUES (2, 2)`); err != nil {
		t.Fatalf("insert after the failed Begin and a failed insert: %v", err)
	}
	if n := count(t, other.DB(), "acct"); n != 2 {
		t.Errorf("%d acct rows; want 2", n)
	}
}

// A transaction of BeginClaim commits only with its completed record:
// code run in it that commits it itself (idemhttp's handler, a bug) or
// Commit commit nothing, and CommitComplete then says that nothing of it
// is committed. The guard forgets the claim when the transaction ends:
// later statements and transactions on the connection commit as usual.
func TestTxGuardClaimCommitsOnlyWithTheRecord(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.SQLite(t)
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE acct (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	complete := func(key string) *driver.TxCompleteParams {
		return &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"), Status: 201,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	}
	claim := func(key string, id int) *sql.Tx {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: claimWait})
		if err != nil || !res.Locked {
			t.Fatalf("BeginClaim(%s) = %+v, %v", key, res, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (?, 1)`, id); err != nil {
			t.Fatalf("insert %d: %v", id, err)
		}
		return tx
	}

	// The code run in the transaction commits it.
	tx := claim("a", 1)
	if err := tx.Commit(); err == nil {
		t.Error("(*sql.Tx).Commit of BeginClaim's transaction succeeded")
	}
	err := drv.CommitComplete(ctx, tx, complete("a"))
	if !errors.Is(err, driver.ErrTxDone) || !errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("CommitComplete after the transaction's own Commit: %v; want ErrTxDone and ErrTxAborted (nothing committed)", err)
	}
	// Rolled back instead.
	tx = claim("b", 2)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	err = drv.CommitComplete(ctx, tx, complete("b"))
	if !errors.Is(err, driver.ErrTxDone) || !errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("CommitComplete after the transaction's own Rollback: %v; want ErrTxDone and ErrTxAborted", err)
	}
	// Driver.Commit is no way around it.
	tx = claim("c", 3)
	if err := drv.Commit(ctx, tx); !errors.Is(err, driver.ErrTxAborted) {
		t.Errorf("Commit of BeginClaim's transaction: %v; want ErrTxAborted", err)
	}
	if n := count(t, db, "acct"); n != 0 {
		t.Fatalf("%d acct rows committed without their record; want none", n)
	}
	if n := count(t, db, "idempotency_record"); n != 0 {
		t.Fatalf("%d records; want none", n)
	}

	// Afterwards: statements outside a transaction, a transaction of
	// Begin, and one of BeginClaim completed, all commit.
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (4, 1)`); err != nil {
		t.Fatalf("autocommit insert: %v", err)
	}
	tx, err = drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO acct VALUES (5, 1)`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit of Begin's transaction: %v", err)
	}
	tx = claim("d", 6)
	if err := drv.CommitComplete(ctx, tx, complete("d")); err != nil {
		t.Fatalf("CommitComplete: %v", err)
	}
	// A claim read, then rolled back (a replay), leaves nothing behind.
	tx, _, err = drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "d", Wait: claimWait})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (7, 1)`); err != nil {
		t.Fatalf("autocommit insert after a rolled back claim: %v", err)
	}
	if n := count(t, db, "acct"); n != 4 {
		t.Errorf("%d acct rows; want 4 (4, 5, 6, 7)", n)
	}
	if n := count(t, db, "idempotency_record"); n != 1 {
		t.Errorf("%d records; want 1", n)
	}
}

// On a guarded connection whose transactions begin DEFERRED (a *sql.DB of
// the application's, which Validate refuses), SQLite calls no hook at the
// COMMIT of a transaction that never wrote: the claim is not enforced
// there, and a claim committed without a write must not leave the guard
// refusing the connection's later writes.
func TestTxGuardClaimDeferred(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := strings.Replace(sqlitedriver.DSN(testdb.SQLitePath(t), 0), "_txlock=immediate", "_txlock=deferred", 1)
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	drv, err := sqlitedriver.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	migrate(t, drv)
	if _, err := db.ExecContext(ctx, `CREATE TABLE acct (id INTEGER PRIMARY KEY, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "a", Wait: claimWait})
	if err != nil || !res.Locked {
		t.Fatalf("BeginClaim = %+v, %v", res, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("Commit of a claim that read only: %v", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO acct VALUES (1, 1)`); err != nil {
		t.Fatalf("autocommit insert afterwards: %v", err)
	}
}
