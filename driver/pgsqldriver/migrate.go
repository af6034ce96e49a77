package pgsqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/migrate"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

// Migrations returns idem's migrations with their SQL rendered for this
// driver's Config: the same migrations as pgdriver's, recorded in the same
// idem_migration table, so a database migrated by either driver is migrated
// for both. Whoever applies them outside idem must also record each one in
// idem_migration, with its CompatibleFrom (see pgdriver's Migrations), or
// MigrationStatus, Validate and Migrate will consider them pending.
func (d *Driver) Migrations() ([]driver.Migration, error) { return d.names.Migrations() }

// MigrationTableSQL returns the rendered SQL that creates the table
// recording applied migrations (and, with Config.Schema, the schema when
// it does not exist, in a DO block: PostgreSQL's CREATE SCHEMA IF NOT
// EXISTS would need CREATE on the database even for an existing schema,
// which its owner, migrating, may not have), or adds compatible_from to one
// created before it, for an external migration tool to run before the
// statements of Migrations (one that splits on semicolons must keep the DO
// statement whole).
func (d *Driver) MigrationTableSQL() string { return d.names.MigrationTableSQL() }

// Migrate implements driver.Driver: it applies pending migrations, each in
// its own transaction. It refuses a server older than PostgreSQL 12, whose
// error would otherwise be a syntax error of migration 006.
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
	if err := d.checkServerVersion(ctx); err != nil {
		return nil, err
	}
	own := func(ctx context.Context, tx *sql.Tx, ms []driver.Migration) ([]driver.Migration, error) {
		return d.apply(ctx, tx, ms, true)
	}
	return migrate.Run(ctx, "pgsqldriver", readCommitted{d}, ms, d.MigrationStatus, own, lockNotAvailable)
}

// readCommitted begins the transactions of Migrate at READ COMMITTED,
// whatever the session's default: a migrator that waited for the migration
// lock must see what the previous holder committed.
type readCommitted struct{ *Driver }

func (r readCommitted) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := r.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("pgsqldriver: begin: %w", err)
	}
	return tx, nil
}

// lockNotAvailable reports whether err is a lock_timeout (of pgx's stdlib
// or lib/pq).
func lockNotAvailable(err error) bool {
	return pgsql.SQLState(err) == pgsql.CodeLockNotAvailable
}

// MigrateTx implements driver.Driver: it applies pending migrations in tx.
func (d *Driver) MigrateTx(ctx context.Context, tx *sql.Tx) error {
	ms, err := d.Migrations()
	if err != nil {
		return err
	}
	now, err := d.apply(ctx, tx, ms, false)
	if err != nil {
		return err
	}
	// A schema a newer binary migrated is refused here too (the caller
	// rolls back), unless its newer migrations accept this binary.
	rows, err := tx.QueryContext(ctx, d.expand(pgsql.MigrationVersionsSQL))
	if err != nil {
		return fmt.Errorf("pgsqldriver: migrate: %w", err)
	}
	applied, err := collect(rows, scanApplied)
	if err != nil {
		return fmt.Errorf("pgsqldriver: migrate: %w", err)
	}
	return migrate.RefuseNewer("pgsqldriver", ms, applied, now)
}

// scanApplied scans a row of MigrationVersionsSQL.
func scanApplied(s scanner) (driver.AppliedMigration, error) {
	var a driver.AppliedMigration
	return a, s.Scan(&a.Version, &a.CompatibleFrom)
}

// MigrationStatus returns which migrations the database has. A missing
// idem_migration table means none is applied.
func (d *Driver) MigrationStatus(ctx context.Context) (driver.MigrationStatus, error) {
	ms, err := d.Migrations()
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	var applied []driver.AppliedMigration
	rows, err := d.db.QueryContext(ctx, d.expand(pgsql.MigrationVersionsSQL))
	if err == nil {
		applied, err = collect(rows, scanApplied)
	}
	if pgsql.SQLState(err) == pgsql.CodeUndefinedTable {
		applied, err = nil, nil
	}
	if err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("pgsqldriver: migration status: %w", err)
	}
	return driver.NewMigrationStatus(ms, applied), nil
}

// Validate returns nil when the database has exactly the migrations of this
// binary, or newer ones besides that all accept this binary (see
// MigrationStatus.NewerAccepted), else an error naming the pending
// versions, or the applied ones this binary does not know. It also refuses
// a default isolation level other than READ COMMITTED, and a session
// DateStyle other than ISO when the pool cannot read timestamps in it (pgx's
// stdlib driver with default_query_exec_mode=exec or simple_protocol; lib/pq
// always asks for ISO), and a server older than PostgreSQL 12 (as Migrate
// does).
// At start-up, not in a readiness probe: once a newer release's first
// replica migrates, it fails on every replica of this one (the schema is
// newer than the binary, unless its new migrations accept this one) while
// they can still serve, and a probe would take them all out of service at
// once during a rolling deploy.
func (d *Driver) Validate(ctx context.Context) error {
	if err := d.checkServerVersion(ctx); err != nil {
		return err
	}
	s, err := d.MigrationStatus(ctx)
	if err := migrate.Validate("pgsqldriver", s, err); err != nil {
		return err
	}
	var level string
	if err := d.db.QueryRowContext(ctx, pgsql.DefaultIsolationSQL).Scan(&level); err != nil {
		return fmt.Errorf("pgsqldriver: read the isolation level: %w", err)
	}
	if err := pgsql.IsolationError("pgsqldriver", level); err != nil {
		return err
	}
	return pgsql.CheckDateStyle(ctx, "pgsqldriver", func(ctx context.Context) (style string, err error) {
		err = d.db.QueryRowContext(ctx, pgsql.DateStyleSQL).Scan(&style)
		return style, err
	}, func(ctx context.Context) (t time.Time, err error) {
		err = d.db.QueryRowContext(ctx, pgsql.TimeProbeSQL).Scan(&t)
		return t, err
	})
}

// checkServerVersion refuses a server older than PostgreSQL 12 (see
// pgsql.MinServerVersionNum), whose error would otherwise be a migration's
// syntax error.
func (d *Driver) checkServerVersion(ctx context.Context) error {
	return pgsql.CheckServerVersion(ctx, "pgsqldriver", func(ctx context.Context, q string) (num int, version string, err error) {
		err = d.db.QueryRowContext(ctx, q).Scan(&num, &version)
		return num, version, err
	})
}

// CheckPrivileges returns nil when the role of the database may do on
// idem's tables what idem's features do (SELECT, INSERT, UPDATE and DELETE
// on each, but no UPDATE on outbox, and SELECT on idem_migration; see the
// README's "Roles and privileges"), else an error naming each table, what
// the role lacks on it and the GRANT that gives it. Call it at start-up
// after Validate, in a service that runs as a role other than the tables'
// owner: a table a migration created without a grant for the role (no ALTER
// DEFAULT PRIVILEGES) would otherwise fail every request or batch that
// writes it, from the first one on. It is not part of Validate: a service
// that uses only some of idem's features may have been granted only their
// tables.
func (d *Driver) CheckPrivileges(ctx context.Context) error {
	return pgsql.CheckPrivileges(ctx, "pgsqldriver", d.names, func(ctx context.Context, query string) ([]pgsql.MissingPrivilege, error) {
		rows, err := d.db.QueryContext(ctx, query)
		if err != nil {
			return nil, err
		}
		defer func() { _ = rows.Close() }()
		var out []pgsql.MissingPrivilege
		for rows.Next() {
			var m pgsql.MissingPrivilege
			if err := rows.Scan(&m.Table, &m.Privileges, &m.Role); err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		return out, rows.Err()
	})
}

// apply applies the rendered migrations ms not yet recorded, returning
// those it applied. The advisory lock is pgdriver's: migrators of both
// drivers serialise on it.
func (d *Driver) apply(ctx context.Context, tx *sql.Tx, ms []driver.Migration, own bool) ([]driver.Migration, error) {
	key := d.names.MigrateLockKey()
	if d.cfg.Schema == "" {
		var schema string
		if err := tx.QueryRowContext(ctx, pgsql.CurrentSchemaSQL).Scan(&schema); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migrate: current schema: %w", err)
		}
		key = pgsql.MigrateLockKeyOf(schema)
	}
	if _, err := tx.ExecContext(ctx, pgsql.MigrationLockSQL, key); err != nil {
		return nil, fmt.Errorf("pgsqldriver: migrate: lock: %w", err)
	}
	if own { // Migrate's own transaction, not a caller's (MigrateTx)
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '"+pgsql.MigrationLockTimeout+"'"); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migrate: lock_timeout: %w", err)
		}
	}
	// Only when missing: an up-to-date database is left without DDL, in
	// MigrateTx too, so that a role without CREATE rights (the service's,
	// once a deployment step migrated) runs them.
	var hasTable bool
	if err := tx.QueryRowContext(ctx, pgsql.MigrationTableExistsSQL, d.names.MigrationTableName()).Scan(&hasTable); err != nil {
		return nil, fmt.Errorf("pgsqldriver: migrate: migration table: %w", err)
	}
	if !hasTable {
		if d.cfg.Schema != "" {
			// Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on
			// the database even when the schema exists, which the schema's
			// owner, migrating, may not have (see pgsql.CreateSchemaSQL).
			var exists bool
			if err := tx.QueryRowContext(ctx, pgsql.SchemaExistsSQL, d.cfg.Schema).Scan(&exists); err != nil {
				return nil, fmt.Errorf("pgsqldriver: migrate: schema: %w", err)
			}
			if !exists {
				if _, err := tx.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgsql.QuoteIdent(d.cfg.Schema)); err != nil {
					return nil, fmt.Errorf("pgsqldriver: migrate: create schema: %w", pgsql.MigrateDenied(err))
				}
			}
		}
		if _, err := tx.ExecContext(ctx, d.expand(pgsql.MigrationTableSQL)); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migrate: create migration table: %w", pgsql.MigrateDenied(err))
		}
	}
	var done []driver.Migration
	hasCompatible := false
	for _, m := range ms {
		var applied bool
		if err := tx.QueryRowContext(ctx, d.expand(pgsql.MigrationAppliedSQL), m.Version).Scan(&applied); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migrate: %w", err)
		}
		if applied {
			continue
		}
		if !hasCompatible {
			// A table created before compatible_from: add it, once.
			if err := tx.QueryRowContext(ctx, pgsql.MigrationHasCompatibleSQL, d.names.MigrationTableName()).Scan(&hasCompatible); err != nil {
				return nil, fmt.Errorf("pgsqldriver: migrate: %w", err)
			}
			if !hasCompatible {
				if _, err := tx.ExecContext(ctx, d.expand(pgsql.MigrationCompatibleSQL)); err != nil {
					return nil, fmt.Errorf("pgsqldriver: migrate: add compatible_from: %w", pgsql.MigrateDenied(err))
				}
				hasCompatible = true
			}
		}
		// No arguments: the drivers send it with the simple protocol,
		// which runs the file's several statements.
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migration %03d_%s: %w", m.Version, m.Name, pgsql.MigrateDenied(err))
		}
		if _, err := tx.ExecContext(ctx, d.expand(pgsql.MigrationRecordSQL), m.Version, m.Name, m.CompatibleFrom); err != nil {
			return nil, fmt.Errorf("pgsqldriver: migrate: record %d: %w", m.Version, err)
		}
		done = append(done, m)
	}
	return done, nil
}
