// Package appmigrate applies the embedded, numbered SQL migrations of
// idemd's own domain tables (payments, orders), separately from idem's:
// each domain records its applied versions in a table of its own, so the
// domains and idem migrate independently in one database.
package appmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dberr"
)

// Postgres applies the pending migrations of fsys/dir in one transaction,
// recording them in table (created if missing). An advisory lock on
// lockName and the current schema serialises replicas starting together;
// the status is read again after, so that versions a newer idemd applied
// while this one waited for the lock are refused (or accepted) as if it
// had migrated first.
// Each statement waits at most LockTimeout for a table lock: a migration
// that must lock a table behind a long transaction gives up (the
// application's writes would otherwise queue behind its lock request for
// as long as that transaction runs), and is tried again from the status,
// up to 5 times, 1 to 8 s apart.
func Postgres(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, dir, table, lockName string) error {
	ms, err := driver.LoadMigrations(fsys, dir)
	if err != nil {
		return err
	}
	wait := time.Second
	for attempt := 1; ; attempt++ {
		err := postgresOnce(ctx, pool, ms, table, lockName)
		if err == nil || attempt == 5 || dberr.SQLState(err) != codeLockNotAvailable {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait *= 2
	}
}

// LockTimeout bounds each statement of a migration waiting for a table
// lock (as idem's own migrations do).
const LockTimeout = "5s"

// codeLockNotAvailable is PostgreSQL's lock_not_available (a lock_timeout).
const codeLockNotAvailable = "55P03"

// codeInsufficientPrivilege is PostgreSQL's insufficient_privilege: the
// role may not change the schema (the service's, not the owner's).
const codeInsufficientPrivilege = "42501"

func postgresOnce(ctx context.Context, pool *pgxpool.Pool, ms []driver.Migration, table, lockName string) error {
	st, err := postgresStatus(ctx, pool, ms, table)
	if err != nil {
		return err
	}
	if done, err := settled(table, st); done || err != nil {
		return err
	}
	t := pgx.Identifier{table}.Sanitize()
	// READ COMMITTED whatever the session's default: a migrator that
	// waited for the lock must see what the previous holder committed.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1 || ':' || current_schema()))`, lockName); err != nil {
			return fmt.Errorf("migrate %s: lock: %w", table, err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+LockTimeout+`'`); err != nil {
			return fmt.Errorf("migrate %s: lock_timeout: %w", table, err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
			version         integer PRIMARY KEY,
			name            text NOT NULL,
			applied_at      timestamptz NOT NULL DEFAULT now(),
			compatible_from integer)`); err != nil {
			return fmt.Errorf("migrate %s: %w", table, err)
		}
		// A table created before compatible_from (driver.Migration's
		// CompatibleFrom) gets it, once: the ALTER's lock would hold the
		// table's readers until this transaction commits.
		var has bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
			WHERE attrelid = to_regclass($1) AND attname = 'compatible_from' AND NOT attisdropped)`, t).Scan(&has); err != nil {
			return fmt.Errorf("migrate %s: %w", table, err)
		}
		if !has {
			if _, err := tx.Exec(ctx, `ALTER TABLE `+t+` ADD COLUMN IF NOT EXISTS compatible_from integer`); err != nil {
				return fmt.Errorf("migrate %s: add compatible_from: %w", table, err)
			}
		}
		for _, m := range ms {
			var applied bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t+` WHERE version = $1)`, m.Version).Scan(&applied); err != nil {
				return fmt.Errorf("migrate %s: %w", table, err)
			}
			if applied {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+t+` (version, name, compatible_from) VALUES ($1, $2, $3)`, m.Version, m.Name, m.CompatibleFrom); err != nil {
				return fmt.Errorf("migrate %s: %w", table, err)
			}
		}
		return nil
	})
	if dberr.SQLState(err) == codeInsufficientPrivilege {
		return fmt.Errorf("%w (migrations of %s are pending and this role may not run them: run idemd migrate up as the tables' owner first; README \"Roles and privileges\")", err, table)
	}
	if err != nil {
		return err
	}
	// A newer idemd may have migrated while this one waited for the lock.
	st, err = postgresStatus(ctx, pool, ms, table)
	if err != nil {
		return err
	}
	return refuseNewer(table, st)
}

// refuseNewer returns settled's error for what st, read after this binary
// applied its pending migrations, holds that it does not know: versions a
// newer idemd applied while this one waited for the migration lock, judged
// as if it had migrated first.
func refuseNewer(table string, st driver.MigrationStatus) error {
	if len(st.Unknown()) == 0 {
		return nil
	}
	_, err := settled(table, st)
	return err
}

// PostgresStatus returns which migrations of fsys/dir the database has,
// recorded in table (none while table is missing), for idemd migrate
// status.
func PostgresStatus(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, dir, table string) (driver.MigrationStatus, error) {
	ms, err := driver.LoadMigrations(fsys, dir)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	return postgresStatus(ctx, pool, ms, table)
}

func postgresStatus(ctx context.Context, pool *pgxpool.Pool, ms []driver.Migration, table string) (driver.MigrationStatus, error) {
	t := pgx.Identifier{table}.Sanitize()
	var applied []driver.AppliedMigration
	var exists bool
	err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t).Scan(&exists)
	if err == nil && exists {
		var rows pgx.Rows
		// compatible_from through the row's JSON: a table created before
		// it has no key for it.
		if rows, err = pool.Query(ctx, `SELECT version, coalesce((to_jsonb(m) ->> 'compatible_from')::integer, 0) FROM `+t+` m`); err == nil {
			applied, err = pgx.CollectRows(rows, pgx.RowToStructByPos[driver.AppliedMigration])
		}
	}
	if err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("migrate %s: status: %w", table, err)
	}
	return driver.NewMigrationStatus(ms, applied), nil
}

// SQLite applies the pending migrations of fsys/dir in one transaction
// (BEGIN IMMEDIATE with a database opened by sqlitedriver, which serialises
// concurrent migrators), recording them in table (created if missing).
func SQLite(ctx context.Context, db *sql.DB, fsys fs.FS, dir, table string) error {
	ms, err := driver.LoadMigrations(fsys, dir)
	if err != nil {
		return err
	}
	st, err := sqliteStatus(ctx, db, ms, table)
	if err != nil {
		return err
	}
	if done, err := settled(table, st); done || err != nil {
		return err
	}
	t := `"` + table + `"`
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", table, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
		version         INTEGER PRIMARY KEY,
		name            TEXT NOT NULL,
		applied_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ')),
		compatible_from INTEGER)`); err != nil {
		return fmt.Errorf("migrate %s: %w", table, err)
	}
	has, err := sqliteHasCompatible(ctx, tx, table)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", table, err)
	}
	if !has {
		if _, err := tx.ExecContext(ctx, `ALTER TABLE `+t+` ADD COLUMN compatible_from INTEGER`); err != nil {
			return fmt.Errorf("migrate %s: add compatible_from: %w", table, err)
		}
	}
	for _, m := range ms {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+t+` WHERE version = ?`, m.Version).Scan(&n); err != nil {
			return fmt.Errorf("migrate %s: %w", table, err)
		}
		if n > 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+t+` (version, name, compatible_from) VALUES (?, ?, ?)`, m.Version, m.Name, m.CompatibleFrom); err != nil {
			return fmt.Errorf("migrate %s: %w", table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", table, err)
	}
	// A newer idemd may have migrated while this one waited for the
	// database.
	if st, err = sqliteStatus(ctx, db, ms, table); err != nil {
		return err
	}
	return refuseNewer(table, st)
}

// SQLiteStatus returns which migrations of fsys/dir the database has,
// recorded in table (none while table is missing), for idemd migrate
// status.
func SQLiteStatus(ctx context.Context, db *sql.DB, fsys fs.FS, dir, table string) (driver.MigrationStatus, error) {
	ms, err := driver.LoadMigrations(fsys, dir)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	return sqliteStatus(ctx, db, ms, table)
}

func sqliteStatus(ctx context.Context, db *sql.DB, ms []driver.Migration, table string) (driver.MigrationStatus, error) {
	t := `"` + table + `"`
	var applied []driver.AppliedMigration
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n)
	var has bool
	if err == nil && n > 0 {
		has, err = sqliteHasCompatible(ctx, db, table)
	}
	if err == nil && n > 0 {
		query := `SELECT version, 0 FROM ` + t
		if has {
			query = `SELECT version, coalesce(compatible_from, 0) FROM ` + t
		}
		var rows *sql.Rows
		if rows, err = db.QueryContext(ctx, query); err == nil {
			for rows.Next() {
				var a driver.AppliedMigration
				if err = rows.Scan(&a.Version, &a.CompatibleFrom); err != nil {
					break
				}
				applied = append(applied, a)
			}
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = rows.Err()
			}
		}
	}
	if err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("migrate %s: status: %w", table, err)
	}
	return driver.NewMigrationStatus(ms, applied), nil
}

// sqliteHasCompatible reports whether table, which exists, has
// compatible_from (a table created before it has not).
func sqliteHasCompatible(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, table string) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = 'compatible_from'`, table).Scan(&n)
	return n > 0, err
}

// settled reports whether nothing is to be done: the database has every
// migration of ms (then no DDL runs, so a role without CREATE rights can
// start on a database migrated by another), or it has one this binary does
// not know (a newer idemd migrated it: an error, unless every such one is
// recorded as accepting this binary and none of ms is pending).
func settled(table string, st driver.MigrationStatus) (bool, error) {
	if len(st.Unknown()) > 0 {
		if err := st.Err(); err != nil {
			return true, fmt.Errorf("migrate %s: %w", table, err)
		}
		return true, nil
	}
	return st.UpToDate(), nil
}
