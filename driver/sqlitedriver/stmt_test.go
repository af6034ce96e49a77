package sqlitedriver

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// has reports whether the statement cache holds query.
func (c *stmtCache) has(query string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stmts[query] != nil
}

// claimWait is the Wait of the tests' claims that are not about the wait:
// with none, BeginClaim waits only a few milliseconds for the single
// connection, which the driver's background preparation of the statements
// first met in a transaction may hold; on a loaded machine that runs out,
// and the claim is not locked.
const claimWait = 5 * time.Second

// openMigrated opens a migrated database file of its own; the caller
// closes it.
func openMigrated(t *testing.T) *Driver {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(t.Context()); err != nil {
		_ = d.Close()
		t.Fatal(err)
	}
	return d
}

func waitPrepared(t *testing.T, c *stmtCache, query string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !c.has(query) {
		if time.Now().After(deadline) {
			t.Fatalf("statement never prepared:\n%s", query)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStatementCache runs the ModeTx claim and the completed record's INSERT
// through the statement cache on Open's single connection: statements first
// met in a transaction are prepared once the transaction has ended (never
// from inside it, which would wait for the connection the transaction
// holds), then serve the next transactions, also after a schema change.
func TestStatementCache(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	getSQL := d.expand(`SELECT ` + recordColumns + `
		FROM {{table}}idempotency_record WHERE scope = ? AND idempotency_key = ?`)
	now := time.Now().UTC().Truncate(time.Microsecond)

	complete := func(key string, body string) {
		t.Helper()
		tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: claimWait})
		if err != nil || !res.Locked || res.Record != nil {
			t.Fatalf("BeginClaim(%s) = %+v, %v; want locked, no record", key, res, err)
		}
		// More statements in the transaction while a preparation is queued:
		// the single connection stays with the transaction.
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS effect (k TEXT PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO effect (k) VALUES (?)`, key); err != nil {
			t.Fatal(err)
		}
		err = d.CommitComplete(ctx, tx, &driver.TxCompleteParams{
			Scope: "s", Key: key, Fingerprint: []byte("fp"), Status: 201, Headers: []byte("{}"),
			Body: []byte(body), CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		})
		if err != nil {
			t.Fatalf("CommitComplete(%s): %v", key, err)
		}
	}
	get := func(key string) *driver.Record {
		t.Helper()
		tx, err := d.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = d.Rollback(ctx, tx) }()
		rec, err := d.UnwrapExecutor(tx).RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: key})
		if err != nil {
			t.Fatalf("RecordGet(%s): %v", key, err)
		}
		return rec
	}

	if d.stmts.has(getSQL) {
		t.Fatal("statement prepared before first use")
	}
	complete("k1", `{"n":1}`)
	waitPrepared(t, d.stmts, getSQL)
	if rec := get("k1"); rec.Status != 201 || !bytes.Equal(rec.Body, []byte(`{"n":1}`)) || !rec.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("record k1 = %+v", rec)
	}
	complete("k2", `{"n":2}`)

	// A schema change after preparation: SQLite recompiles the statement.
	if _, err := d.DB().ExecContext(ctx, `ALTER TABLE idempotency_record ADD COLUMN note TEXT`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB().ExecContext(ctx, `CREATE INDEX idempotency_record_created ON idempotency_record (created_at)`); err != nil {
		t.Fatal(err)
	}
	complete("k3", `{"n":3}`)
	for i, key := range []string{"k1", "k2", "k3"} {
		if rec := get(key); rec.Key != key || !bytes.Equal(rec.Body, []byte(`{"n":`+string(rune('1'+i))+`}`)) {
			t.Fatalf("record %s = %+v", key, rec)
		}
	}
	// The completed record's INSERT is prepared too, and still refuses a
	// key that is taken (no ON CONFLICT: the safety net).
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = d.CommitComplete(ctx, tx, &driver.TxCompleteParams{
		Scope: "s", Key: "k1", Fingerprint: []byte("fp"), Status: 200, Body: []byte("x"),
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	})
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete of a stored key: %v, want ErrLeaseLost", err)
	}

	// Outside a transaction a statement is prepared at once.
	if _, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k2"}); err != nil {
		t.Fatal(err)
	}
}

// TestStatementCacheCloseWhileQueued closes the driver while a statement
// waits to be prepared behind an open transaction: Close returns at once
// instead of waiting for the connection.
func TestStatementCacheCloseWhileQueued(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := openMigrated(t)
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.UnwrapExecutor(tx).RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet: %v", err)
	}
	closePromptly(t, d, tx, "Close waited for the transaction's connection")
	_ = tx.Rollback()
}

// closePromptly closes d and fails the test (after rolling tx back, which
// frees what Close may wait for) unless Close returns within 10 s.
func closePromptly(t *testing.T, d *Driver, tx *sql.Tx, failure string) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = tx.Rollback()
		t.Fatal(failure)
	}
}

// TestStatementCacheBeforeMigrate uses the driver before its tables exist:
// the failed preparation does not stick to the statement, which works once
// the tables are created, in a transaction and outside one.
func TestStatementCacheBeforeMigrate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := Open(filepath.Join(t.TempDir(), "early.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	get := &driver.RecordGetParams{Scope: "s", Key: "k"}
	if _, err := d.Executor().RecordGet(ctx, get); err == nil || errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet before Migrate: %v, want a missing-table error", err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Executor().RecordGet(ctx, get); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet after Migrate: %v, want ErrNotFound", err)
	}
	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Rollback(ctx, tx) }()
	if _, err := d.UnwrapExecutor(tx).RecordGet(ctx, get); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet in a transaction after Migrate: %v, want ErrNotFound", err)
	}
}

// cached reports how many statements the cache holds or has queued.
func (c *stmtCache) cached() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stmts) + len(c.pending)
}

// TestStatementCacheKeepsConstantTexts drives the outbox with batches of
// every size from 1 to 40: the multi-row INSERTs and the marks of several
// events, whose texts are built per call, stay out of the cache; the
// constant statements (a one-row INSERT, a one-event mark, the claim) are in
// it. The events are all relayed, in order.
func TestStatementCacheKeepsConstantTexts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ex := d.Executor()
	now := time.Now().UTC().Truncate(time.Microsecond)
	total := 0
	for size := 1; size <= 40; size++ {
		rows := make([]driver.OutboxRow, size)
		for i := range rows {
			rows[i] = driver.OutboxRow{
				EventID: uuid.Must(uuid.NewV7()), EventType: "t", Key: "k", Payload: []byte("{}"),
				OccurredAt: now, CreatedAt: now,
			}
		}
		if n, err := ex.OutboxInsert(ctx, rows); err != nil || n != size {
			t.Fatalf("OutboxInsert(%d rows) = %d, %v", size, n, err)
		}
		total += size
	}
	published := 0
	for size := 1; published < total; size = size%40 + 1 {
		claimed, err := ex.OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: now, Limit: size})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, len(claimed))
		for i, r := range claimed {
			if r.ID <= int64(published) && published > 0 {
				t.Fatalf("row %d claimed after %d rows were published", r.ID, published)
			}
			ids[i] = r.ID
		}
		if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: ids, At: now}); err != nil {
			t.Fatal(err)
		}
		published += len(ids)
	}
	if got := d.stmts.cached(); got > 4 {
		t.Fatalf("%d statements cached, want the 3 constant ones (texts built per call reached the cache)", got)
	}
	if left, err := ex.OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: now, Limit: 10}); err != nil || len(left) != 0 {
		t.Fatalf("rows left unpublished: %d, %v", len(left), err)
	}
}

// storeRecords stores a completed record under each key (scope "s"), its
// body the key.
func storeRecords(t *testing.T, d *Driver, keys ...string) {
	t.Helper()
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, key := range keys {
		tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: claimWait})
		if err != nil || !res.Locked {
			t.Fatalf("BeginClaim(%s) = %+v, %v", key, res, err)
		}
		if err := d.CommitComplete(ctx, tx, &driver.TxCompleteParams{
			Scope: "s", Key: key, Fingerprint: []byte("fp"), Status: 201, Body: []byte(key),
			CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		}); err != nil {
			t.Fatalf("CommitComplete(%s): %v", key, err)
		}
	}
}

// TestStatementCacheConcurrentUseOfATransaction uses one transaction from
// several places at once, as database/sql allows: every transaction on a
// connection shares that connection's prepared statement, and SQLite runs
// it in place, so a second use while the first one's rows are open must
// not touch it (it would fail to bind, or step the other cursor).
func TestStatementCacheConcurrentUseOfATransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	storeRecords(t, d, keys...)
	getSQL := d.expand(`SELECT ` + recordColumns + `
		FROM {{table}}idempotency_record WHERE scope = ? AND idempotency_key = ?`)
	if _, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k0"}); err != nil {
		t.Fatal(err)
	}
	waitPrepared(t, d.stmts, getSQL)

	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Rollback(ctx, tx) }()
	ex := d.UnwrapExecutor(tx)

	// The statement's rows stay open while the same statement runs again.
	open, err := d.inTx(tx).QueryContext(ctx, getSQL, "s", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k2"}); err != nil || string(rec.Body) != "k2" {
		t.Fatalf("RecordGet(k2) while k1's rows are open = %+v, %v", rec, err)
	}
	if _, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "none"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("RecordGet(none) while k1's rows are open: %v, want ErrNotFound", err)
	}
	var scope, key string
	if !open.Next() {
		t.Fatalf("k1's rows ended early: %v", open.Err())
	}
	cols, _ := open.Columns()
	dest := make([]any, len(cols))
	dest[0], dest[1] = &scope, &key
	for i := 2; i < len(dest); i++ {
		dest[i] = new(any)
	}
	if err := open.Scan(dest...); err != nil || key != "k1" {
		t.Fatalf("k1's row = %q, %v", key, err)
	}
	if err := open.Close(); err != nil {
		t.Fatal(err)
	}

	// Goroutines sharing the transaction.
	errs := make(chan error, len(keys))
	for _, key := range keys {
		go func() {
			for range 100 {
				rec, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: key})
				if err != nil {
					errs <- fmt.Errorf("RecordGet(%s): %w", key, err)
					return
				}
				if string(rec.Body) != key {
					errs <- fmt.Errorf("RecordGet(%s) returned %s's record", key, rec.Body)
					return
				}
			}
			errs <- nil
		}()
	}
	for range keys {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatementCacheTransactionOfAnotherDB hands the driver a transaction
// of another *sql.DB on the same file once its statements are prepared:
// database/sql refuses to run a statement prepared on one database in a
// transaction of another, so the driver runs the text there.
func TestStatementCacheTransactionOfAnotherDB(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "shared.db")
	d, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	storeRecords(t, d, "k1", "k2") // the claim's statements, met in transactions
	storeRecords(t, d, "k3")       // now prepared
	if _, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k1"}); err != nil {
		t.Fatal(err)
	}

	other, err := sql.Open("sqlite", DSN(path, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	ex := d.UnwrapExecutor(tx)
	if rec, err := ex.RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k2"}); err != nil || string(rec.Body) != "k2" {
		t.Fatalf("RecordGet in the other database's transaction = %+v, %v", rec, err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := d.CommitComplete(ctx, tx, &driver.TxCompleteParams{
		Scope: "s", Key: "k4", Fingerprint: []byte("fp"), Status: 201, Body: []byte("k4"),
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}); err != nil {
		t.Fatalf("CommitComplete in the other database's transaction: %v", err)
	}
	if rec, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k4"}); err != nil || string(rec.Body) != "k4" {
		t.Fatalf("record stored through the other database = %+v, %v", rec, err)
	}
}

// TestStatementCacheCloseWithTransactionOpen closes a driver on the
// caller's single-connection database while a transaction holds the
// connection and a call on a prepared statement waits for it: Close
// returns at once (it does not wait for the statement's calls in flight),
// the transaction goes on and commits, and the waiting call then runs.
func TestStatementCacheCloseWithTransactionOpen(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := sql.Open("sqlite", DSN(filepath.Join(t.TempDir(), "caller.db"), 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	d, err := New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	storeRecords(t, d, "k1")
	if _, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k1"}); err != nil {
		t.Fatal(err)
	}

	tx, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := d.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k1"})
		waiting <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); db.Stats().WaitCount == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the call never waited for the connection")
		}
		time.Sleep(time.Millisecond)
	}
	closePromptly(t, d, tx, "Close waited for a call waiting for the transaction's connection")
	if rec, err := d.UnwrapExecutor(tx).RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "k1"}); err != nil || string(rec.Body) != "k1" {
		t.Fatalf("RecordGet in the transaction after Close = %+v, %v", rec, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if err != nil {
			t.Fatalf("the waiting call: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting call never ran")
	}
}
