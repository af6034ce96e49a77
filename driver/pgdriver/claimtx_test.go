package pgdriver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/testdb"
)

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
		lock := drv.RecordLockKey("s", key)
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, lock).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
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
				err = tx.Rollback(ctx)
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
	if err := tx.Rollback(ctx); err != nil {
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
