package pgdriver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// advisoryLockHeld reports whether a session holds the 64-bit advisory lock
// lock, as pg_locks shows it to a session of pool: ask from another session
// than the holder's (a session's own advisory locks are reentrant).
func advisoryLockHeld(t *testing.T, pool *pgxpool.Pool, lock int64) bool {
	t.Helper()
	var n int
	err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, lock).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// On the uncontended path BeginClaim holds the key's session-level lock and
// sends BEGIN with the transaction's first statement, whatever that
// statement is. For each way a handler can start, on commit and on
// rollback: the first statement is inside the transaction (gone after a
// rollback, kept after a commit), the lock is held while the transaction
// runs and released with its end (checked in pg_locks, from another
// session: a session's own advisory locks are reentrant).
func TestClaimTxFirstStatementAndLock(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	if _, err := pool.Exec(ctx, `CREATE TABLE fast (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	held := func(key string) bool {
		t.Helper()
		return advisoryLockHeld(t, pool, drv.RecordLockKey("s", key))
	}
	stored := func(k string) bool {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fast WHERE k = $1`, k).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	starts := map[string]func(tx pgx.Tx, k string) error{
		"none": func(pgx.Tx, string) error { return nil },
		"Exec": func(tx pgx.Tx, k string) error {
			_, err := tx.Exec(ctx, `INSERT INTO fast VALUES ($1)`, k)
			return err
		},
		"QueryRow": func(tx pgx.Tx, k string) error {
			var got string
			return tx.QueryRow(ctx, `INSERT INTO fast VALUES ($1) RETURNING k`, k).Scan(&got)
		},
		"Query": func(tx pgx.Tx, k string) error {
			rows, err := tx.Query(ctx, `INSERT INTO fast VALUES ($1) RETURNING k`, k)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if n != 1 {
				return fmt.Errorf("Query returned %d rows", n)
			}
			return rows.Err()
		},
		"SendBatch": func(tx pgx.Tx, k string) error {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO fast VALUES ($1)`, k)
			b.Queue(`SELECT 1`)
			br := tx.SendBatch(ctx, b)
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return err
			}
			var one int
			if err := br.QueryRow().Scan(&one); err != nil {
				_ = br.Close()
				return err
			}
			return br.Close()
		},
		"Savepoint": func(tx pgx.Tx, k string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO fast VALUES ($1)`, k); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		"Conn": func(tx pgx.Tx, k string) error {
			_, err := tx.Conn().Exec(ctx, `INSERT INTO fast VALUES ($1)`, k)
			return err
		},
		"CopyFrom": func(tx pgx.Tx, k string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"fast"}, []string{"k"}, pgx.CopyFromRows([][]any{{k}}))
			return err
		},
	}
	for name, start := range starts {
		for _, commit := range []bool{false, true} {
			key := fmt.Sprintf("%s-%v", name, commit)
			tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: time.Now()})
			if err != nil || !res.Locked {
				t.Fatalf("%s: BeginClaim = %+v, %v", key, res, err)
			}
			if !held(key) {
				t.Fatalf("%s: the key's lock is not held during the claim", key)
			}
			if err := start(tx, key); err != nil {
				t.Fatalf("%s: first statement: %v", key, err)
			}
			if commit {
				err = drv.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"),
					Status: 200, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
			} else {
				err = drv.Rollback(ctx, tx)
			}
			if err != nil {
				t.Fatalf("%s: end: %v", key, err)
			}
			if want := commit && name != "none"; stored(key) != want {
				t.Errorf("%s: the first statement's row is stored: %v, want %v", key, !want, want)
			}
			if held(key) {
				t.Errorf("%s: the key's lock is still held after the transaction ended", key)
			}
		}
	}

	// A failed first statement: the rollback still releases the lock, and
	// the key can be claimed again.
	tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "bad", Now: time.Now()})
	if err != nil || !res.Locked {
		t.Fatalf("BeginClaim = %+v, %v", res, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil {
		t.Fatal("insert into a missing table succeeded")
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatalf("Rollback after a failed statement: %v", err)
	}
	if held("bad") {
		t.Fatal("the key's lock is still held after a failed statement and a rollback")
	}
	// A unique violation at the completed record's INSERT (the key was
	// stored by a writer that took no lock): ErrLeaseLost, nothing of the
	// transaction committed, the lock released.
	tx, res, err = drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "Exec-true", Now: time.Now().Add(2 * time.Hour)})
	if err != nil || !res.Locked {
		t.Fatalf("BeginClaim of an expired key = %+v, %v", res, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fast VALUES ('dup-effect')`); err != nil {
		t.Fatal(err)
	}
	err = drv.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: "Exec-true", Fingerprint: []byte("fp"),
		Status: 200, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete over a stored key: %v, want ErrLeaseLost", err)
	}
	if stored("dup-effect") || held("Exec-true") {
		t.Fatalf("after ErrLeaseLost: effect stored %v, lock held %v; want neither", stored("dup-effect"), held("Exec-true"))
	}
}

// The claim's transaction behaves as pgx's own where a handler would notice
// a difference, on the uncontended path (BEGIN not sent yet, the key's
// session-level lock held): a first batch that pgx could not send leaves
// the transaction to be begun by the next statement; a first statement of
// several statements without arguments runs inside the transaction; rows
// read to the end need no Close before the next statement; options that
// only Exec and Query interpret are honoured; an ended transaction or
// savepoint answers ErrTxClosed; a unique violation of a deferred
// constraint of the handler's tables is the handler's failure, not a
// record stored by another writer.
func TestClaimTxBehavesAsPgxTx(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	ctx := t.Context()
	pool := drv.Pool()
	if _, err := pool.Exec(ctx, `CREATE TABLE fx (k text PRIMARY KEY);
		CREATE TABLE deferred (k text, CONSTRAINT deferred_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	count := func(where string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fx WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	claim := func(key string) pgx.Tx {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: time.Now()})
		if err != nil || !res.Locked {
			t.Fatalf("BeginClaim(%s) = %+v, %v", key, res, err)
		}
		t.Cleanup(func() { _ = drv.Rollback(context.Background(), tx) }) // after a failure
		return tx
	}
	complete := func(tx pgx.Tx, key string) error {
		return drv.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("fp"),
			Status: 200, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
	}

	// A batch with a statement the server cannot prepare is not run,
	// BEGIN included; the next statement begins the transaction, so the
	// rollback undoes it.
	tx := claim("unsent")
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO fx VALUES ($1)`, "unsent-0")
	b.Queue(`INSERT INTO fx VALUES ($1`, "unsent-1")
	if err := tx.SendBatch(ctx, b).Close(); err == nil {
		t.Fatal("a batch with a syntax error succeeded")
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fx VALUES ($1)`, "unsent"); err != nil {
		t.Fatal(err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n := count(`k LIKE 'unsent%'`); n != 0 {
		t.Fatal("a write after an unsent first batch survived the rollback: it ran outside the transaction")
	}

	// Several statements in one text without arguments, first.
	for _, commit := range []bool{false, true} {
		key := fmt.Sprint("multi-", commit)
		tx := claim(key)
		tag, err := tx.Exec(ctx, `INSERT INTO fx VALUES ('`+key+`-a'); INSERT INTO fx VALUES ('`+key+`-b')`)
		if err != nil || tag.RowsAffected() != 1 || !tag.Insert() {
			t.Fatalf("%s: Exec of two statements = %q, %v", key, tag, err)
		}
		if commit {
			err = complete(tx, key)
		} else {
			err = drv.Rollback(ctx, tx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 0, true: 2}[commit]; count(`k LIKE '`+key+`-%'`) != want {
			t.Fatalf("%s: %d rows stored, want %d", key, count(`k LIKE '`+key+`-%'`), want)
		}
	}

	// Rows read to the end, not closed, then the next statement.
	tx = claim("rows")
	rows, err := tx.Query(ctx, `INSERT INTO fx VALUES ($1) RETURNING k`, "rows")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO fx VALUES ($1)`, "rows-2"); err != nil {
		t.Fatalf("a statement after rows read to the end: %v", err)
	}
	if err := complete(tx, "rows"); err != nil {
		t.Fatal(err)
	}
	if n := count(`k IN ('rows', 'rows-2')`); n != 2 {
		t.Fatalf("%d rows stored, want 2", n)
	}

	// Result formats, an option of Query, on the first statement.
	tx = claim("formats")
	var got string
	if err := tx.QueryRow(ctx, `INSERT INTO fx VALUES ($1) RETURNING k`, pgx.QueryResultFormats{pgx.TextFormatCode}, "formats").Scan(&got); err != nil || got != "formats" {
		t.Fatalf("QueryRow with QueryResultFormats = %q, %v", got, err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}

	// The transaction's own Commit and Rollback are refused (a handler
	// must not end idemhttp's transaction); savepoints still work, and
	// CommitComplete commits.
	tx = claim("owned")
	if _, err := tx.Exec(ctx, `INSERT INTO fx VALUES ($1)`, "owned"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit of BeginClaim's transaction succeeded")
	}
	if err := tx.Rollback(ctx); err == nil {
		t.Fatal("Rollback of BeginClaim's transaction succeeded")
	}
	if sp, err := tx.Begin(ctx); err != nil {
		t.Fatal(err)
	} else if err := sp.Rollback(ctx); err != nil {
		t.Fatalf("savepoint rollback: %v", err)
	}
	if err := complete(tx, "owned"); err != nil {
		t.Fatalf("CommitComplete after refused Commit and Rollback: %v", err)
	}

	// A failed statement aborted the transaction: CommitComplete says so
	// (nothing committed), not a failure of unknown outcome.
	tx = claim("aborted")
	if _, err := tx.Exec(ctx, `INSERT INTO fx VALUES ($1)`, "owned"); err == nil {
		t.Fatal("a duplicate INSERT succeeded")
	}
	if err := complete(tx, "aborted"); !errors.Is(err, driver.ErrTxAborted) {
		t.Fatalf("CommitComplete of an aborted transaction: %v, want ErrTxAborted", err)
	}

	// Ended transactions and savepoints.
	tx = claim("ended")
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sp.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow on a released savepoint: %v, want ErrTxClosed", err)
	}
	if err := sp.SendBatch(ctx, &pgx.Batch{}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("SendBatch on a released savepoint: %v, want ErrTxClosed", err)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	b = &pgx.Batch{}
	b.Queue(`SELECT 1`)
	if err := tx.SendBatch(ctx, b).Close(); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("SendBatch after Rollback: %v, want ErrTxClosed", err)
	}
	if tx.Conn() != nil {
		t.Fatal("Conn after Rollback returned the pool's connection")
	}

	// A deferred unique constraint of the handler's table fails the COMMIT.
	tx = claim("deferred")
	if _, err := tx.Exec(ctx, `INSERT INTO deferred VALUES ($1), ($1)`, "x"); err != nil {
		t.Fatal(err)
	}
	err = complete(tx, "deferred")
	if !errors.Is(err, driver.ErrTxAborted) || errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("CommitComplete with a deferred violation: %v, want ErrTxAborted, not ErrLeaseLost", err)
	}
	if rec, err := drv.Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "s", Key: "deferred"}); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("record after the failed COMMIT = %+v, %v; want none", rec, err)
	}
}

// idem's claims need READ COMMITTED (a claim reads the record with a
// snapshot taken after the key's lock): with another default isolation
// level, Validate, the record claim and the relay's claim refuse to run and
// say what to change, instead of silently letting a duplicate execute.
func TestIsolationLevelChecked(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 1) // one connection: SET applies to every use
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	drivertest.IsolationChecked[pgx.Tx](t, drv, func(ctx context.Context, sql string) error {
		_, err := pool.Exec(ctx, sql)
		return err
	})
}

// A role or database whose DateStyle is not ISO: a pool whose results are
// text (exec, simple_protocol: the modes for PgBouncer before 1.21) cannot
// read its timestamps, and every claim fails; Validate refuses it at
// start-up and says what to set. A pool with binary results works.
func TestDateStyleChecked(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.Schema(t, 1)
			cfg, err := pgxpool.ParseConfig(testdb.DSN())
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1 // one connection: SET applies to every use
			cfg.ConnConfig.RuntimeParams["search_path"] = schema
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
			drivertest.DateStyleChecked[pgx.Tx](t, drv, mode != pgx.QueryExecModeCacheStatement, func(ctx context.Context, sql string) error {
				_, err := pool.Exec(ctx, sql)
				return err
			})
		})
	}
}

// The uncontended claim answers from one session whatever the previous
// claim on it did: a completed live record is replayed whole and unlocked,
// after a claim that took the lock as after one that found it taken; an
// expired or in-progress record, or none, is claimed (locked) with what
// the key holds read after the lock; a lock held by another session is
// not taken, and no record is answered then.
func TestClaimReplayOrLockOnOneSession(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 1) // one session: each claim follows the previous one on it
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema})
	other := testdb.Postgres(t).Pool() // another session, to hold a key's lock
	ctx := t.Context()
	now := time.Now()
	claim := func(key string, at time.Time) (pgx.Tx, *driver.TxClaimResult) {
		t.Helper()
		tx, res, err := drv.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: at})
		if err != nil {
			t.Fatalf("BeginClaim(%s): %v", key, err)
		}
		if tx != nil {
			// Ended when the test fails before it does: the pool's one
			// session must be free to drop the schema.
			t.Cleanup(func() { _ = drv.Rollback(context.Background(), tx) })
		}
		if res.Locked != (tx != nil) {
			t.Fatalf("BeginClaim(%s): Locked %v with transaction %v", key, res.Locked, tx != nil)
		}
		return tx, res
	}
	lockHeld := func(key string) bool {
		t.Helper()
		return advisoryLockHeld(t, other, drv.RecordLockKey("s", key))
	}
	stored := &driver.TxCompleteParams{Scope: "s", Key: "done", Fingerprint: []byte("fp-1"), Status: 201,
		Headers: []byte("h"), Body: []byte(`{"id":1}`), CreatedAt: now.Truncate(time.Microsecond),
		ExpiresAt: now.Add(time.Hour).Truncate(time.Microsecond)}
	tx, res := claim("done", now)
	if !res.Locked || res.Record != nil {
		t.Fatalf("first claim: %+v, want locked without a record", res)
	}
	if err := drv.CommitComplete(ctx, tx, stored); err != nil {
		t.Fatal(err)
	}
	replayed := func(when string) {
		t.Helper()
		tx, res := claim("done", now.Add(time.Minute))
		if tx != nil {
			_ = drv.Rollback(ctx, tx)
			t.Fatalf("%s: the completed record was claimed again, want a replay", when)
		}
		r := res.Record
		if r == nil || r.State != driver.StateCompleted || r.Status != 201 || string(r.Body) != `{"id":1}` ||
			string(r.Headers) != "h" || string(r.Fingerprint) != "fp-1" || r.Scope != "s" || r.Key != "done" ||
			!r.CreatedAt.Equal(stored.CreatedAt) || !r.ExpiresAt.Equal(stored.ExpiresAt) {
			t.Fatalf("%s: replayed %+v, want the stored record", when, r)
		}
		if lockHeld("done") {
			t.Fatalf("%s: the key's lock is held after a replay", when)
		}
	}
	replayed("after the claim that stored it")

	// Past its expiry: claimed, with the expired record read after the
	// lock (the caller replaces it).
	tx, res = claim("done", now.Add(2*time.Hour))
	if !res.Locked || res.Record == nil || res.Record.Key != "done" || string(res.Record.Body) != `{"id":1}` {
		t.Fatalf("claim of the expired record: %+v, want locked with the record", res)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	replayed("after a claim that took the lock")

	// An in-progress record (a lease-mode writer's): claimed, read.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_record (scope, idempotency_key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
		VALUES ('s', 'leased', 'fp', 'in_progress', 'tok', $1, $2, $3)`, now.Add(time.Minute), now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	tx, res = claim("leased", now)
	if !res.Locked || res.Record == nil || res.Record.State != driver.StateInProgress || res.Record.LeaseToken != "tok" {
		t.Fatalf("claim of an in-progress record: %+v, want locked with it", res)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}

	// Another session holds the key's lock: not locked, no record.
	conn, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, drv.RecordLockKey("s", "busy")); err != nil {
		t.Fatal(err)
	}
	if tx, res := claim("busy", now); res.Locked || res.Record != nil || tx != nil {
		t.Fatalf("claim of a key locked elsewhere: %+v, want neither locked nor a record", res)
	}
	replayed("after a claim that found the lock taken")
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, drv.RecordLockKey("s", "busy")); err != nil {
		t.Fatal(err)
	}
	tx, res = claim("busy", now)
	if !res.Locked || res.Record != nil {
		t.Fatalf("claim of the freed key: %+v, want locked without a record", res)
	}
	if err := drv.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if lockHeld("busy") || lockHeld("leased") || lockHeld("done") {
		t.Fatal("a key's lock is still held after every claim ended")
	}
}
