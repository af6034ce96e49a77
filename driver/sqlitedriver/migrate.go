package sqlitedriver

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/idemkit/idem/driver/internal/migrate"

	"github.com/idemkit/idem/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

const migrationTableSQL = `CREATE TABLE IF NOT EXISTS {{table}}idem_migration (
		version         INTEGER PRIMARY KEY,
		name            TEXT NOT NULL,
		applied_at      INTEGER NOT NULL,
		compatible_from INTEGER)`

// migrationCompatibleSQL adds compatible_from (driver.Migration's
// CompatibleFrom) to a table created before it.
const migrationCompatibleSQL = `ALTER TABLE {{table}}idem_migration ADD COLUMN compatible_from INTEGER`

// Migrations returns idem's migrations with their SQL rendered for this
// driver's Config (table prefix): plain SQL that a DBA, goose, atlas or
// flyway can run, in version order, each in a transaction.
//
// Whoever applies them outside idem must also record each one in the
// idem_migration table (INSERT INTO idem_migration (version, name,
// applied_at, compatible_from) VALUES (..., ..., unixepoch('subsec') *
// 1000000, ...), with the table created by MigrationTableSQL, and
// compatible_from the migration's CompatibleFrom), or MigrationStatus,
// Validate and Migrate will consider them pending (and Migrate would run
// them again). A version recorded without compatible_from refuses every
// binary that predates it. A table created before compatible_from needs
// ALTER TABLE idem_migration ADD COLUMN compatible_from INTEGER first
// (Migrate adds it by itself).
func (d *Driver) Migrations() ([]driver.Migration, error) {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	for i := range ms {
		ms[i].SQL = d.expand(ms[i].SQL)
	}
	return ms, nil
}

// MigrationTableSQL returns the rendered SQL that creates the table
// recording applied migrations, for an external migration tool to run
// before the statements of Migrations. A table created before
// compatible_from is left as it is (SQLite has no ADD COLUMN IF NOT
// EXISTS): the tool adds it once, ALTER TABLE idem_migration ADD COLUMN
// compatible_from INTEGER, before it records a version with it (Migrate
// adds it by itself).
func (d *Driver) MigrationTableSQL() string {
	return d.expand(migrationTableSQL) + ";\n"
}

// Migrate implements driver.Driver. Each migration runs in its own
// transaction; BEGIN IMMEDIATE serialises concurrent migrators.
func (d *Driver) Migrate(ctx context.Context) error {
	_, err := d.MigrateApplied(ctx)
	return err
}

// MigrateApplied is Migrate, returning the migrations it applied.
func (d *Driver) MigrateApplied(ctx context.Context) ([]driver.Migration, error) {
	ms, err := d.Migrations()
	if err != nil {
		return nil, err
	}
	return migrate.Run(ctx, "sqlitedriver", d, ms, d.MigrationStatus, d.apply, func(err error) bool {
		// Another process migrating the same file (a *sql.DB without
		// _txlock=immediate upgrades its transaction and may be refused).
		return isBusy(err) || errors.Is(err, driver.ErrLockTimeout)
	})
}

// MigrateTx implements driver.Driver.
func (d *Driver) MigrateTx(ctx context.Context, tx *sql.Tx) error {
	ms, err := d.Migrations()
	if err != nil {
		return err
	}
	now, err := d.apply(ctx, tx, ms)
	if err != nil {
		return err
	}
	// A schema a newer binary migrated is refused here too (the caller
	// rolls back), unless its newer migrations accept this binary.
	applied, err := d.appliedMigrations(ctx, tx)
	if err != nil {
		return fmt.Errorf("sqlitedriver: migrate: %w", err)
	}
	return migrate.RefuseNewer("sqlitedriver", ms, applied, now)
}

// queryer is a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// hasCompatible reports whether the migration table has compatible_from
// (a table created before it has not).
func (d *Driver) hasCompatible(ctx context.Context, q queryer) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = 'compatible_from'`,
		d.prefix+"idem_migration").Scan(&n)
	return n > 0, err
}

// appliedMigrations reads the rows of the migration table, which exists.
func (d *Driver) appliedMigrations(ctx context.Context, q queryer) ([]driver.AppliedMigration, error) {
	has, err := d.hasCompatible(ctx, q)
	if err != nil {
		return nil, err
	}
	query := `SELECT version, 0 FROM {{table}}idem_migration ORDER BY version`
	if has {
		query = `SELECT version, coalesce(compatible_from, 0) FROM {{table}}idem_migration ORDER BY version`
	}
	rows, err := q.QueryContext(ctx, d.expand(query))
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var applied []driver.AppliedMigration
	for rows.Next() {
		var a driver.AppliedMigration
		if err := rows.Scan(&a.Version, &a.CompatibleFrom); err != nil {
			return nil, err
		}
		applied = append(applied, a)
	}
	return applied, rows.Err()
}

// MigrationStatus returns which migrations the database has. A missing
// idem_migration table means none is applied.
func (d *Driver) MigrationStatus(ctx context.Context) (driver.MigrationStatus, error) {
	ms, err := d.Migrations()
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`,
		d.prefix+"idem_migration").Scan(&n); err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("sqlitedriver: migration status: %w", err)
	}
	if n == 0 {
		return driver.NewMigrationStatus(ms, nil), nil
	}
	applied, err := d.appliedMigrations(ctx, d.db)
	if err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("sqlitedriver: migration status: %w", err)
	}
	return driver.NewMigrationStatus(ms, applied), nil
}

// Validate returns nil when the database has exactly the migrations of this
// binary, or newer ones besides that all accept this binary (see
// MigrationStatus.NewerAccepted), else an error naming the pending
// versions, or the applied ones this binary does not know (a newer idem
// migrated the database), at
// start-up (not in a readiness probe: see pgdriver's Validate). It also
// checks the settings of a database given to New
// (Open applies them): one connection (SetMaxOpenConns(1): concurrent
// claims of one process would otherwise fail with SQLITE_BUSY, some at
// COMMIT, where the outcome is reported unknown), a busy timeout (else
// another process's write fails a claim at once) and transactions that
// begin IMMEDIATE (_txlock=immediate: else BeginClaim takes no lock, and
// two processes both run the command of one key).
func (d *Driver) Validate(ctx context.Context) error {
	if n := d.db.Stats().MaxOpenConnections; n != 1 {
		return fmt.Errorf("sqlitedriver: the *sql.DB allows %d open connections (0: unlimited), want 1: call SetMaxOpenConns(1), or use Open", n)
	}
	var busy int
	if err := d.db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		return fmt.Errorf("sqlitedriver: read busy_timeout: %w", err)
	}
	if busy <= 0 {
		return errors.New("sqlitedriver: busy_timeout is 0: another process's write would fail claims at once; open the database with sqlitedriver.DSN (or Open)")
	}
	if err := d.checkImmediate(ctx); err != nil {
		return err
	}
	s, err := d.MigrationStatus(ctx)
	return migrate.Validate("sqlitedriver", s, err)
}

// apply applies the rendered migrations ms not yet recorded, returning
// those it applied.
func (d *Driver) apply(ctx context.Context, tx *sql.Tx, ms []driver.Migration) ([]driver.Migration, error) {
	if _, err := tx.ExecContext(ctx, d.expand(migrationTableSQL)); err != nil {
		return nil, fmt.Errorf("sqlitedriver: migrate: create migration table: %w", err)
	}
	var done []driver.Migration
	hasCompatible := false
	for _, m := range ms {
		var n int
		if err := tx.QueryRowContext(ctx, d.expand(`SELECT count(*) FROM {{table}}idem_migration WHERE version = ?`), m.Version).Scan(&n); err != nil {
			return nil, fmt.Errorf("sqlitedriver: migrate: %w", err)
		}
		if n > 0 {
			continue
		}
		if !hasCompatible {
			// A table created before compatible_from: add it, once.
			has, err := d.hasCompatible(ctx, tx)
			if err != nil {
				return nil, fmt.Errorf("sqlitedriver: migrate: %w", err)
			}
			if !has {
				if _, err := tx.ExecContext(ctx, d.expand(migrationCompatibleSQL)); err != nil {
					return nil, fmt.Errorf("sqlitedriver: migrate: add compatible_from: %w", err)
				}
			}
			hasCompatible = true
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("sqlitedriver: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, d.expand(`INSERT INTO {{table}}idem_migration (version, name, applied_at, compatible_from)
			VALUES (?, ?, unixepoch('subsec') * 1000000, ?)`), m.Version, m.Name, m.CompatibleFrom); err != nil {
			return nil, fmt.Errorf("sqlitedriver: migrate: record %d: %w", m.Version, err)
		}
		done = append(done, m)
	}
	return done, nil
}

// checkImmediate returns an error when the transactions of d.db begin
// DEFERRED (a *sql.DB opened without _txlock=immediate): such a BEGIN takes
// no lock, so BeginClaim's transaction is not the key's lock, and
// BeginClaim in two processes both find the key free and both run its
// command (the second fails only at CommitComplete, after its effects).
// It begins a transaction on d.db and, while it is open, tries BEGIN
// IMMEDIATE on a connection of its own without waiting: that succeeds only
// when the first transaction does not hold the write lock. Once seen
// holding it, the check is not repeated. An in-memory database (no other
// connection can open it) passes.
func (d *Driver) checkImmediate(ctx context.Context) error {
	if d.immediate.Load() {
		return nil
	}
	var (
		seq        int
		name, file string
	)
	if err := d.db.QueryRowContext(ctx, `PRAGMA database_list`).Scan(&seq, &name, &file); err != nil {
		return fmt.Errorf("sqlitedriver: read the database file: %w", err)
	}
	if file == "" {
		return nil
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if isBusy(err) {
		// A DEFERRED BEGIN takes no lock, so it cannot be busy.
		d.immediate.Store(true)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sqlitedriver: check BEGIN IMMEDIATE: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	probe, err := sql.Open("sqlite", fileURI(file)+"?mode=rw&_txlock=immediate&_pragma=busy_timeout(0)")
	if err != nil {
		return fmt.Errorf("sqlitedriver: check BEGIN IMMEDIATE: %w", err)
	}
	defer func() { _ = probe.Close() }()
	ptx, err := probe.BeginTx(ctx, nil)
	switch {
	case err == nil:
		_ = ptx.Rollback()
		return errors.New("sqlitedriver: the *sql.DB begins transactions DEFERRED: BeginClaim would take no lock, and two processes would both run the command of one key; open it with _txlock=immediate (sqlitedriver.DSN, or Open)")
	case isBusy(err):
		d.immediate.Store(true)
		return nil
	default:
		return fmt.Errorf("sqlitedriver: check BEGIN IMMEDIATE: %w", err)
	}
}
