package sqlitedriver_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
)

func openBare(t *testing.T, cfg *sqlitedriver.Config) *sqlitedriver.Driver {
	t.Helper()
	drv, err := sqlitedriver.Open(testdb.SQLitePath(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	return drv
}

// schemaOf describes the tables and indexes of db.
func schemaOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT type, name, coalesce(sql, '') FROM sqlite_master
		WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rows.Close() }()
	var b strings.Builder
	for rows.Next() {
		var typ, name, s string
		if err := rows.Scan(&typ, &name, &s); err != nil {
			t.Fatal(err)
		}
		b.WriteString(typ + " " + name + " " + strings.Join(strings.Fields(s), " ") + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestMigrationsAppliedByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := &sqlitedriver.Config{TablePrefix: "x_"}
	byHand, byIdem := openBare(t, cfg), openBare(t, cfg)

	ms, err := byHand.Migrations()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Migrations = %d, %v", len(ms), err)
	}
	for _, m := range ms {
		if strings.Contains(m.SQL, "{{") {
			t.Errorf("migration %d not rendered:\n%s", m.Version, m.SQL)
		}
	}
	if s := byHand.MigrationTableSQL(); !strings.Contains(s, "x_idem_migration") || strings.Contains(s, "{{") {
		t.Errorf("MigrationTableSQL = %s", s)
	}

	st, err := byHand.MigrationStatus(ctx)
	if err != nil {
		t.Fatalf("status on an empty database: %v", err)
	}
	if st.UpToDate() || len(st.Pending) != len(ms) || st.Current() != 0 || st.Latest != ms[len(ms)-1].Version {
		t.Fatalf("empty database status = %+v", st)
	}
	if err := byHand.Validate(ctx); err == nil || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("Validate on an empty database = %v", err)
	}

	db := byHand.DB()
	if _, err := db.ExecContext(ctx, byHand.MigrationTableSQL()); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO x_idem_migration (version, name, applied_at)
			VALUES (?, ?, unixepoch('subsec') * 1000000)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := byIdem.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*sqlitedriver.Driver{byHand, byIdem} {
		st, err := d.MigrationStatus(ctx)
		if err != nil || !st.UpToDate() || st.Current() != st.Latest {
			t.Fatalf("status after migrating = %+v, %v", st, err)
		}
		if err := d.Validate(ctx); err != nil {
			t.Fatalf("Validate: %v", err)
		}
	}
	if a, b := schemaOf(t, byHand.DB()), schemaOf(t, byIdem.DB()); a != b || a == "" {
		t.Fatalf("schemas differ:\nby hand:\n%s\nby Migrate:\n%s", a, b)
	}
	if done, err := byHand.MigrateApplied(ctx); err != nil || len(done) != 0 {
		t.Fatalf("MigrateApplied after hand = %v, %v", done, err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := openBare(t, nil)
	done, err := drv.MigrateApplied(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := drv.Migrations()
	if len(done) != len(ms) {
		t.Fatalf("applied %d of %d", len(done), len(ms))
	}
	last := ms[len(ms)-1]
	if _, err := drv.DB().ExecContext(ctx, `DELETE FROM idem_migration WHERE version = ?`, last.Version); err != nil {
		t.Fatal(err)
	}
	err = drv.Validate(ctx)
	if err == nil || !strings.Contains(err.Error(), "pending migrations "+strconv.Itoa(last.Version)) {
		t.Fatalf("Validate with one pending = %v", err)
	}
	if _, err := drv.DB().ExecContext(ctx, `INSERT INTO idem_migration (version, name, applied_at) VALUES (?, 'x', 0), (999, 'future', 0)`, last.Version); err != nil {
		t.Fatal(err)
	}
	err = drv.Validate(ctx)
	if err == nil || !strings.Contains(err.Error(), "database schema is newer than this binary: version 999") {
		t.Fatalf("Validate with a newer version = %v", err)
	}
}

// A *sql.DB given to New without the settings Open applies is refused by
// Validate (idemd runs it at start; readiness probes too): several
// connections make concurrent claims fail with SQLITE_BUSY, some at
// COMMIT; no busy timeout fails them at once when another process writes.
func TestValidateChecksSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "plain.db")
	good, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = good.Close() })
	if err := good.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := good.Validate(ctx); err != nil {
		t.Fatalf("Validate of Open's database: %v", err)
	}
	plain, err := sql.Open("sqlite", path) // no pragmas, unlimited connections
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	drv, err := sqlitedriver.New(plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Validate(ctx); err == nil || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
		t.Errorf("Validate with unlimited connections = %v", err)
	}
	plain.SetMaxOpenConns(1)
	if err := drv.Validate(ctx); err == nil || !strings.Contains(err.Error(), "busy_timeout") {
		t.Errorf("Validate without a busy timeout = %v", err)
	}
	if _, err := plain.ExecContext(ctx, `PRAGMA busy_timeout = 5000`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Validate(ctx); err == nil || !strings.Contains(err.Error(), "_txlock=immediate") {
		t.Errorf("Validate with deferred transactions = %v", err)
	}
	immediate := openWithDSN(t, "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if err := immediate.Validate(ctx); err != nil {
		t.Errorf("Validate with one connection, a busy timeout and BEGIN IMMEDIATE = %v", err)
	}
}

// openWithDSN returns a driver (New) on a *sql.DB of the caller's, opened
// with dsn and limited to one connection.
func openWithDSN(t *testing.T, dsn string) *sqlitedriver.Driver {
	t.Helper()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	drv, err := sqlitedriver.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// A *sql.DB whose transactions begin DEFERRED (sql.Open without
// _txlock=immediate) takes no lock at Begin: BeginClaim in two processes
// both "lock" the same key and both run the command, and the second one
// only fails when it stores its response. Validate, which passed such a
// database (one connection, a busy timeout), must refuse it.
func TestValidateRefusesDeferredTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "deferred.db")
	migrate(t, open(t, path, nil))
	deferred := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
	a, b := openWithDSN(t, deferred), openWithDSN(t, deferred)

	// What Validate guards against: both processes get the key's lock.
	// A long Wait: on a loaded machine 200ms ran out before A even had
	// its connection (Locked false, uncontended); B, deferred, returns at
	// once all the same, and would wait it out only if Begin locked.
	claim := &driver.TxClaimParams{Scope: "s", Key: "k", Wait: 10 * time.Second}
	txA, resA, err := a.BeginClaim(ctx, claim)
	if err != nil || !resA.Locked {
		t.Fatalf("BeginClaim A: %+v, %v", resA, err)
	}
	txB, resB, err := b.BeginClaim(ctx, claim)
	if err != nil {
		t.Fatalf("BeginClaim B: %v", err)
	}
	if resB.Locked {
		_ = txB.Rollback()
	}
	_ = txA.Rollback()
	if !resB.Locked {
		t.Fatal("BeginClaim B waited for A: the deferred database locks after all; the test no longer shows the hazard")
	}

	for name, d := range map[string]*sqlitedriver.Driver{"A": a, "B": b} {
		err := d.Validate(ctx)
		if err == nil || !strings.Contains(err.Error(), "_txlock=immediate") {
			t.Errorf("Validate of %s (deferred transactions) = %v; want an error naming _txlock=immediate", name, err)
		}
	}
	good := openWithDSN(t, "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if err := good.Validate(ctx); err != nil {
		t.Errorf("Validate with _txlock=immediate = %v", err)
	}
	if err := open(t, path, nil).Validate(ctx); err != nil {
		t.Errorf("Validate of Open's database = %v", err)
	}
}

// Processes migrating one file at once, each with its own *sql.DB: through
// Open (BEGIN IMMEDIATE) and through New with a database of the caller's
// (deferred transactions, which SQLite may refuse to upgrade: retried).
func TestConcurrentMigrateProcesses(t *testing.T) {
	t.Parallel()
	for _, viaNew := range []bool{false, true} {
		t.Run(map[bool]string{false: "Open", true: "New"}[viaNew], func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "x.db")
			const n = 4
			drvs := make([]*sqlitedriver.Driver, n)
			for i := range n {
				if viaNew {
					db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
					if err != nil {
						t.Fatal(err)
					}
					db.SetMaxOpenConns(1)
					t.Cleanup(func() { _ = db.Close() })
					if drvs[i], err = sqlitedriver.New(db, nil); err != nil {
						t.Fatal(err)
					}
				} else {
					d, err := sqlitedriver.Open(path, nil)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = d.Close() })
					drvs[i] = d
				}
			}
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { <-start; errs[i] = drvs[i].Migrate(t.Context()) })
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("process %d: Migrate: %v", i, err)
				}
			}
			// New's databases begin DEFERRED, which Validate refuses:
			// check the schema through Open's.
			if err := open(t, path, nil).Validate(t.Context()); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// A database left by an earlier release with a parked event and its key's
// backlog behind it (migration 006): after migration 007 the backlog is
// held, the claim returns the other keys' events only, and once the event
// is unparked, it then its backlog, in order.
func TestMigrationHoldsTheBacklogOfAParkedKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := openBare(t, nil)
	db := drv.DB()
	if _, err := db.ExecContext(ctx, drv.MigrationTableSQL()); err != nil {
		t.Fatal(err)
	}
	ms, err := drv.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version > 6 {
			break
		}
		if _, err := db.ExecContext(ctx, m.SQL); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO idem_migration (version, name, applied_at) VALUES (?, ?, 0)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	// p1 (parked) p2 p3, then q1; q0 before them all published.
	for i, key := range []string{"q", "p", "p", "p", "q"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			VALUES (printf('00000000-0000-4000-8000-%012d', ?1), 'Test.Happened.v1', ?2, x'7b7d', 0, 0)`, i, key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `UPDATE outbox SET published_at = 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE outbox SET parked_at = 1, attempts = 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if held := testdb.Strings(t, db, `SELECT id FROM outbox WHERE held = 1 ORDER BY id`); strings.Join(held, ",") != "3,4" {
		t.Errorf("held after the migration: %v; want the rows behind the parked one, 3 and 4", held)
	}
	claim := func() string {
		t.Helper()
		rows, err := drv.Executor().OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now(), Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, strconv.FormatInt(r.ID, 10))
		}
		return strings.Join(ids, ",")
	}
	if got := claim(); got != "5" {
		t.Errorf("claim with p1 parked: %s; want 5 (q1)", got)
	}
	if n, err := drv.Executor().OutboxUnpark(ctx, &driver.OutboxUnparkParams{Keys: []string{"p"}, Limit: 10}); err != nil || n != 1 {
		t.Fatalf("OutboxUnpark = %d, %v", n, err)
	}
	if got := claim(); got != "2,3,4,5" {
		t.Errorf("claim after the unpark: %s; want 2,3,4,5", got)
	}
	// A park holds the rows of the key already there behind it.
	for i := range 2 {
		if _, err := db.ExecContext(ctx, `INSERT INTO outbox (event_id, event_type, record_key, payload, occurred_at, created_at)
			VALUES (printf('00000000-0000-4000-8000-%012d', ?1), 'Test.Happened.v1', 'r', x'7b7d', 0, 0)`, 10+i); err != nil {
			t.Fatal(err)
		}
	}
	if err := drv.Executor().OutboxPark(ctx, &driver.OutboxParkParams{ID: 6, Error: "poison", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if held := testdb.Strings(t, db, `SELECT id FROM outbox WHERE held = 1 AND record_key = 'r'`); strings.Join(held, ",") != "7" {
		t.Errorf("held of r after parking r1: %v; want r2 (7)", held)
	}
	if got := claim(); got != "2,3,4,5" {
		t.Errorf("claim with r1 parked: %s; want 2,3,4,5", got)
	}
}

// A database a newer binary migrated: accepted when its newer versions
// record that they accept this binary, refused otherwise; and the upgrade
// from a migration table created before compatible_from.
func TestNewerSchema(t *testing.T) {
	t.Parallel()
	drivertest.NewerSchema(t, drivertest.MigrationTable[*sql.Tx]{
		New: func(t *testing.T) (drivertest.Migrator[*sql.Tx], func(string) error) {
			drv := openBare(t, &sqlitedriver.Config{TablePrefix: "x_"})
			return drv, func(q string) error {
				_, err := drv.DB().ExecContext(t.Context(), strings.ReplaceAll(q, "{{table}}", "x_idem_migration"))
				return err
			}
		},
		CreateOld: `CREATE TABLE {{table}} (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at INTEGER NOT NULL)`,
		InsertOld: `INSERT INTO {{table}} (version, name, applied_at) VALUES ({{version}}, '{{name}}', 0)`,
		Insert:    `INSERT INTO {{table}} (version, name, applied_at, compatible_from) VALUES ({{version}}, '{{name}}', 0, {{from}})`,
	})
}
