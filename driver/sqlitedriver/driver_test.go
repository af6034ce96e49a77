package sqlitedriver_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/drivertest"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDriver(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Backend[*sql.Tx]{
		New: func(t *testing.T) driver.Driver[*sql.Tx] { return testdb.SQLite(t) },
		NewUnmigrated: func(t *testing.T) driver.Driver[*sql.Tx] {
			return open(t, testdb.SQLitePath(t), nil)
		},
		// Another *sql.DB on the same file: as another process.
		Reopen: func(t *testing.T, drv driver.Driver[*sql.Tx]) driver.Driver[*sql.Tx] {
			return open(t, dbFile(t, drv.(*sqlitedriver.Driver).DB()), nil)
		},
	})
}

// dbFile returns the path of db's main database file.
func dbFile(t *testing.T, db *sql.DB) string {
	t.Helper()
	var (
		seq        int
		name, file string
	)
	if err := db.QueryRowContext(t.Context(), `PRAGMA database_list`).Scan(&seq, &name, &file); err != nil || file == "" {
		t.Fatalf("database file: %q, %v", file, err)
	}
	return file
}

// open opens path without migrating it and closes it when the test ends.
func open(t *testing.T, path string, cfg *sqlitedriver.Config) *sqlitedriver.Driver {
	t.Helper()
	drv, err := sqlitedriver.Open(path, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	return drv
}

func migrate(t *testing.T, drv *sqlitedriver.Driver) {
	t.Helper()
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
}

func claimParams(key, token string, now time.Time) *driver.RecordClaimParams {
	return &driver.RecordClaimParams{
		Scope:          "tenant-1 POST /payments",
		Key:            key,
		Fingerprint:    []byte("fp"),
		LeaseToken:     token,
		LeaseExpiresAt: now.Add(30 * time.Second),
		Now:            now,
		ExpiresAt:      now.Add(24 * time.Hour),
	}
}

func schemaObjects(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		t.Fatalf("list schema: %v", err)
	}
	defer func() { _ = rows.Close() }()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatalf("scan: %v", err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("list schema: %v", err)
	}
	return names
}

// Config.TablePrefix names every table and index; drivers with different
// prefixes share one database without seeing each other's records.
func TestTablePrefix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	app := open(t, testdb.SQLitePath(t), &sqlitedriver.Config{TablePrefix: "app_"})
	migrate(t, app)
	objects := schemaObjects(t, app.DB())
	for _, name := range objects {
		if !strings.HasPrefix(name, "app_") {
			t.Errorf("schema object %s lacks the prefix app_", name)
		}
	}
	for _, name := range []string{"app_idem_migration", "app_idempotency_record", "app_idempotency_record_expires_at_idx"} {
		if i := sort.SearchStrings(objects, name); i == len(objects) || objects[i] != name {
			t.Errorf("schema objects %v lack %s", objects, name)
		}
	}
	if got := app.Table("idempotency_record"); got != "app_idempotency_record" {
		t.Errorf("Table() = %s", got)
	}

	other, err := sqlitedriver.New(app.DB(), &sqlitedriver.Config{TablePrefix: "other_"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	migrate(t, other)
	plain, err := sqlitedriver.New(app.DB(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	migrate(t, plain)
	got := schemaObjects(t, app.DB())
	for _, name := range []string{"other_idempotency_record", "idempotency_record", "idempotency_record_expires_at_idx", "idem_migration"} {
		if i := sort.SearchStrings(got, name); i == len(got) || got[i] != name {
			t.Errorf("schema objects %v lack %s", got, name)
		}
	}

	now := time.Now()
	drivers := map[string]*sqlitedriver.Driver{"app": app, "other": other, "plain": plain}
	for name, d := range drivers {
		res, err := d.Executor().RecordClaim(ctx, claimParams("key-1", name, now))
		if err != nil || !res.Claimed {
			t.Fatalf("claim through %s: %+v, %v; want Claimed", name, res, err)
		}
	}
	if err := app.Executor().RecordComplete(ctx, &driver.RecordCompleteParams{
		Scope: "tenant-1 POST /payments", Key: "key-1", LeaseToken: "app", Status: 201, Body: []byte("app"),
	}); err != nil {
		t.Fatalf("complete through app: %v", err)
	}
	for _, name := range []string{"other", "plain"} {
		rec, err := drivers[name].Executor().RecordGet(ctx, &driver.RecordGetParams{Scope: "tenant-1 POST /payments", Key: "key-1"})
		if err != nil || rec.State != driver.StateInProgress || rec.LeaseToken != name {
			t.Errorf("record through %s: %+v, %v; want its own in-progress claim", name, rec, err)
		}
	}

	for _, bad := range []string{"App_", "app-", "1app", `x"; DROP TABLE y; --`} {
		if _, err := sqlitedriver.New(app.DB(), &sqlitedriver.Config{TablePrefix: bad}); err == nil {
			t.Errorf("New with TablePrefix %q succeeded; want an error", bad)
		}
	}
}

func TestOpenRejectsBadPath(t *testing.T) {
	t.Parallel()
	for _, p := range []string{""} {
		if d, err := sqlitedriver.Open(p, nil); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) succeeded; want an error", p)
		}
	}
	if _, err := sqlitedriver.New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// What was committed is still there after the process closes and reopens
// the file.
func TestReopenKeepsData(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := testdb.SQLitePath(t)
	now := time.Now().Truncate(time.Microsecond)
	body := []byte("\x00stored response\xff")

	first, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	migrate(t, first)
	p := claimParams("key-1", "tok", now)
	if res, err := first.Executor().RecordClaim(ctx, p); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	tx, err := first.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if err := first.UnwrapExecutor(tx).RecordComplete(ctx, &driver.RecordCompleteParams{
		Scope: p.Scope, Key: p.Key, LeaseToken: "tok", Status: 201, Headers: []byte(`{"A":["b"]}`), Body: body,
	}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if err := first.Commit(ctx, tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	second := open(t, path, nil)
	migrate(t, second) // a restart migrates again: a no-op
	res, err := second.Executor().RecordClaim(ctx, claimParams("key-1", "retry", now.Add(time.Minute)))
	if err != nil {
		t.Fatalf("claim after reopen: %v", err)
	}
	if res.Claimed {
		t.Fatal("after reopen, the retry claimed the key again: the committed record was lost")
	}
	rec := res.Existing
	if rec.State != driver.StateCompleted || rec.Status != 201 || !bytes.Equal(rec.Body, body) ||
		string(rec.Headers) != `{"A":["b"]}` || !rec.CreatedAt.Equal(now) || !rec.ExpiresAt.Equal(p.ExpiresAt) {
		t.Errorf("after reopen: %+v; want the completed record with its response", rec)
	}
}

func pragma(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, name string) string {
	t.Helper()
	var v string
	if err := q.QueryRowContext(t.Context(), "PRAGMA "+name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

// The settings idem's guarantees rest on are really in effect on the
// connection idem uses, inside transactions too.
func TestPragmas(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"journal_mode": "wal",
		"synchronous":  "2", // FULL: a commit survives power loss
		"busy_timeout": "10000",
		"foreign_keys": "1",
		// the -wal file is cut back to 64 MiB after a long reader
		"journal_size_limit": "67108864",
	}
	drv := open(t, testdb.SQLitePath(t), nil)
	migrate(t, drv)
	for name, w := range want {
		if got := pragma(t, drv.DB(), name); got != w {
			t.Errorf("PRAGMA %s = %s, want %s", name, got, w)
		}
	}
	tx, err := drv.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	for _, name := range []string{"synchronous", "busy_timeout", "foreign_keys"} {
		if got := pragma(t, tx, name); got != want[name] {
			t.Errorf("in a transaction, PRAGMA %s = %s, want %s", name, got, want[name])
		}
	}
	if err := drv.Rollback(t.Context(), tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}

	for _, bad := range []time.Duration{-time.Second, 500 * time.Microsecond, 1000 * time.Hour} {
		// SQLite would take them as busy_timeout(0): no waiting at all.
		if d, err := sqlitedriver.Open(testdb.SQLitePath(t), &sqlitedriver.Config{BusyTimeout: bad}); err == nil {
			_ = d.Close()
			t.Errorf("Open with BusyTimeout %s succeeded; want an error", bad)
		}
	}
	custom := open(t, testdb.SQLitePath(t), &sqlitedriver.Config{BusyTimeout: 1500 * time.Millisecond})
	if got := pragma(t, custom.DB(), "busy_timeout"); got != "1500" {
		t.Errorf("with Config.BusyTimeout 1.5s, PRAGMA busy_timeout = %s, want 1500", got)
	}
}

// Write transactions start with BEGIN IMMEDIATE: a second process's writer
// waits (busy timeout) at Begin for the first to commit, instead of failing
// half-way through its transaction.
func TestWritersAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := testdb.SQLitePath(t)
	a := open(t, path, nil)
	migrate(t, a)
	impatient := open(t, path, &sqlitedriver.Config{BusyTimeout: 100 * time.Millisecond})
	patient := open(t, path, nil)

	txA, err := a.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin A: %v", err)
	}
	t.Cleanup(func() { _ = a.Rollback(context.Background(), txA) })
	p := claimParams("key-1", "a", time.Now())
	if res, err := a.UnwrapExecutor(txA).RecordClaim(ctx, p); err != nil || !res.Claimed {
		t.Fatalf("claim in A: %+v, %v", res, err)
	}

	// A writer whose busy timeout runs out fails at Begin, before it did
	// any work.
	start := time.Now()
	m := stallmeter.Start(t)
	if tx, err := impatient.Begin(ctx); err == nil {
		_ = impatient.Rollback(ctx, tx)
		t.Fatal("second writer began a transaction while A holds the write lock: Begin is not IMMEDIATE")
	}
	ran, stalled := m.Elapsed()
	if d := time.Since(start); d < 90*time.Millisecond || ran > 2*time.Second {
		t.Errorf("Begin gave up after %s (%s less the process's stalls); want about the 100ms busy timeout", d, ran)
	}
	if stalled > 0 {
		t.Logf("the process stalled %s", stalled)
	}

	// A patient writer waits for A to commit, then sees A's record.
	type begun struct {
		tx  *sql.Tx
		err error
	}
	done := make(chan begun, 1)
	go func() {
		tx, err := patient.Begin(ctx)
		done <- begun{tx, err}
	}()
	select {
	case b := <-done:
		if b.err == nil {
			_ = patient.Rollback(ctx, b.tx)
		}
		t.Fatalf("second writer's Begin returned while A was open: %v", b.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.Commit(ctx, txA); err != nil {
		t.Fatalf("Commit A: %v", err)
	}
	var b begun
	select {
	case b = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("second writer still waiting 10s after A committed")
	}
	if b.err != nil {
		t.Fatalf("second writer's Begin after A committed: %v", b.err)
	}
	defer func() { _ = patient.Rollback(context.Background(), b.tx) }()
	res, err := patient.UnwrapExecutor(b.tx).RecordClaim(ctx, claimParams("key-1", "b", time.Now()))
	if err != nil {
		t.Fatalf("claim in B: %v", err)
	}
	if res.Claimed || res.Existing.LeaseToken != "a" {
		t.Errorf("B's claim: Claimed=%v Existing=%+v; want A's record", res.Claimed, res.Existing)
	}
	if err := patient.Commit(ctx, b.tx); err != nil {
		t.Fatalf("Commit B: %v", err)
	}
}

// A database path may contain any character a file name may.
func TestOpenPathWithURICharacters(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"a#b", "c%41d"} {
		d := filepath.Join(t.TempDir(), dir)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(d, "idem.db")
		drv := open(t, path, nil)
		migrate(t, drv)
		if err := drv.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("Open(%q) did not create that file: %v", path, err)
		}
	}
}

// Another process holding SQLite's write lock for the whole busy timeout
// is a lock wait that timed out: driver.ErrLockTimeout, as PostgreSQL's
// lock_timeout (idemhttp answers 409 in progress, not 503 store
// unavailable).
func TestBusyIsLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	a, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := sqlitedriver.Open(path, &sqlitedriver.Config{BusyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	tx, err := a.Begin(ctx) // BEGIN IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// Waiting longer than the busy timeout: ErrLockTimeout.
	if _, _, err := b.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Wait: time.Second, Now: time.Now()}); !errors.Is(err, driver.ErrLockTimeout) {
		t.Errorf("BeginClaim while another process writes: %v; want ErrLockTimeout", err)
	}
	// Not waiting (Wait bounds the busy wait too): not locked, at once,
	// even with the default 10s busy timeout (a bound far from it: the
	// process may stall for seconds on a loaded machine).
	c, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	m := stallmeter.Start(t)
	if _, res, err := c.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Now: time.Now()}); err != nil || res.Locked {
		t.Errorf("BeginClaim without Wait while another process writes: %+v, %v; want not locked", res, err)
	}
	if took, stalled := m.Elapsed(); took > 3*time.Second {
		t.Errorf("BeginClaim without Wait took %s (the process stalled %s more): it waited for the 10s busy timeout", took, stalled)
	}
	_, err = b.Records().RecordClaim(ctx, &driver.RecordClaimParams{Scope: "s", Key: "k", Fingerprint: []byte("f"),
		LeaseToken: "t", Now: time.Now(), LeaseExpiresAt: time.Now().Add(time.Minute), ExpiresAt: time.Now().Add(time.Hour)})
	if !errors.Is(err, driver.ErrLockTimeout) {
		t.Errorf("RecordClaim while another process writes: %v; want ErrLockTimeout", err)
	}
}

// A reader that holds a snapshot (a backup, an operator's query, a second
// process) keeps SQLite from reusing the -wal file from its start, so the
// file grows with every commit while the reader lasts. Once the reader is
// gone the file must come back under the journal size limit instead of
// keeping its largest size for as long as the process runs.
func TestWALShrinksAfterLongReader(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := testdb.SQLitePath(t)
	drv := open(t, path, nil)
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE scratch (b BLOB NOT NULL)`); err != nil {
		t.Fatalf("create: %v", err)
	}

	// Another connection, as another process, holds a read transaction.
	reader, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatalf("open reader: %v", err)
	}
	defer reader.Close()
	rtx, err := reader.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("reader begin: %v", err)
	}
	var n int
	if err := rtx.QueryRowContext(ctx, `SELECT count(*) FROM scratch`).Scan(&n); err != nil {
		t.Fatalf("reader select: %v", err)
	}

	const limit = 64 << 20
	blob := bytes.Repeat([]byte{0x5a}, 256<<10)
	write := func(txs, rows int) {
		t.Helper()
		for range txs {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			for range rows {
				if _, err := tx.ExecContext(ctx, `INSERT INTO scratch (b) VALUES (?)`, blob); err != nil {
					t.Fatalf("insert: %v", err)
				}
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM scratch WHERE rowid % 2 = 0`); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
	}
	walSize := func() int64 {
		t.Helper()
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatalf("stat -wal: %v", err)
		}
		return fi.Size()
	}

	write(20, 16) // about 80 MiB of pages while the reader holds its snapshot
	if got := walSize(); got <= limit {
		t.Fatalf("with a reader open the -wal file is %d bytes; want over %d (the test needs a grown file)", got, limit)
	}
	if err := rtx.Rollback(); err != nil {
		t.Fatalf("reader rollback: %v", err)
	}
	// The reader is gone: the next commits checkpoint the log and start it
	// over from its beginning.
	write(3, 1)
	if got := walSize(); got > limit {
		t.Errorf("after the reader ended and later commits, the -wal file is %d bytes (%.0f MiB); want at most %d (64 MiB)", got, float64(got)/(1<<20), limit)
	}
}
