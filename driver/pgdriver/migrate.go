package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver/internal/migrate"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

const migrationTableSQL = pgsql.MigrationTableSQL

// Migrations returns idem's migrations with their SQL rendered for this
// driver's Config (schema and table prefix): plain SQL that a DBA, goose,
// atlas or flyway can run, in version order, each in a transaction.
// Migration 008 creates PL/pgSQL functions whose dollar-quoted bodies
// contain semicolons: a tool that splits a file on semicolons must be told
// where those statements end (goose: -- +goose StatementBegin and
// StatementEnd around each CREATE FUNCTION); psql and flyway need nothing.
//
// Whoever applies them outside idem must also record each one in the
// idem_migration table (INSERT INTO idem_migration (version, name,
// compatible_from) VALUES (...), with the table created by
// MigrationTableSQL, and compatible_from the migration's CompatibleFrom),
// or MigrationStatus, Validate and Migrate will consider them pending (and
// Migrate would run them again). A version recorded without
// compatible_from refuses every binary that predates it.
func (d *Driver) Migrations() ([]driver.Migration, error) {
	return d.names.Migrations()
}

// MigrationTableSQL returns the rendered SQL that creates the table
// recording applied migrations (and, with Config.Schema, the schema when
// it does not exist, in a DO block: PostgreSQL's CREATE SCHEMA IF NOT
// EXISTS would need CREATE on the database even for an existing schema,
// which its owner, migrating, may not have), or adds compatible_from to one
// created before it, for an external migration tool to run before the
// statements of Migrations (one that splits on semicolons must keep the DO
// statement whole).
func (d *Driver) MigrationTableSQL() string {
	return d.names.MigrationTableSQL()
}

// Migrate implements driver.Driver: it applies pending migrations, each in its
// own transaction. It refuses a server older than PostgreSQL 12, whose
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
	own := func(ctx context.Context, tx pgx.Tx, ms []driver.Migration) ([]driver.Migration, error) {
		return d.apply(ctx, tx, ms, true)
	}
	return migrate.Run(ctx, "pgdriver", readCommitted{d}, ms, d.MigrationStatus, own, lockNotAvailable)
}

// readCommitted begins the transactions of Migrate at READ COMMITTED,
// whatever the session's default: a migrator that waited for the migration
// lock must see what the previous holder committed.
type readCommitted struct{ *Driver }

func (r readCommitted) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("pgdriver: begin: %w", err)
	}
	return tx, nil
}

// lockNotAvailable reports whether err is a lock_timeout.
func lockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == pgsql.CodeLockNotAvailable
}

// MigrateTx implements driver.Driver: it applies pending migrations in tx.
func (d *Driver) MigrateTx(ctx context.Context, tx pgx.Tx) error {
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
	rows, err := tx.Query(ctx, d.expand(pgsql.MigrationVersionsSQL))
	if err != nil {
		return fmt.Errorf("pgdriver: migrate: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[driver.AppliedMigration])
	if err != nil {
		return fmt.Errorf("pgdriver: migrate: %w", err)
	}
	return migrate.RefuseNewer("pgdriver", ms, applied, now)
}

// MigrationStatus returns which migrations the database has. A missing
// idem_migration table means none is applied.
func (d *Driver) MigrationStatus(ctx context.Context) (driver.MigrationStatus, error) {
	ms, err := d.Migrations()
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	var applied []driver.AppliedMigration
	rows, err := d.pool.Query(ctx, d.expand(pgsql.MigrationVersionsSQL))
	if err == nil {
		applied, err = pgx.CollectRows(rows, pgx.RowToStructByPos[driver.AppliedMigration])
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == pgsql.CodeUndefinedTable {
		applied, err = nil, nil
	}
	if err != nil {
		return driver.MigrationStatus{}, fmt.Errorf("pgdriver: migration status: %w", err)
	}
	return driver.NewMigrationStatus(ms, applied), nil
}

// Validate returns nil when the database has exactly the migrations of this
// binary, or newer ones besides that all accept this binary (see
// MigrationStatus.NewerAccepted), else an error naming the pending
// versions, or the applied ones this binary does not know (a newer idem
// migrated the database) and the oldest binary they accept. It also
// tells whether the pool goes through a pooler (see TransactionPooling),
// and refuses a session DateStyle in which the pool cannot read timestamps
// (see "Behind a connection pooler" in the package documentation), and a
// server older than PostgreSQL 12 (as Migrate does).
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
	if err := migrate.Validate("pgdriver", s, err); err != nil {
		return err
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgdriver: read the isolation level: %w", err)
	}
	defer conn.Release()
	var (
		level string
		pid   uint32
	)
	if err := conn.QueryRow(ctx, isolationAndPIDSQL).Scan(&level, &pid); err != nil {
		return fmt.Errorf("pgdriver: read the isolation level: %w", err)
	}
	if pid != conn.Conn().PgConn().PID() {
		d.pooled.Store(true)
	}
	if err := pgsql.IsolationError("pgdriver", level); err != nil {
		return err
	}
	return pgsql.CheckDateStyle(ctx, "pgdriver", func(ctx context.Context) (style string, err error) {
		err = conn.QueryRow(ctx, pgsql.DateStyleSQL).Scan(&style)
		return style, err
	}, func(ctx context.Context) (t time.Time, err error) {
		err = conn.QueryRow(ctx, pgsql.TimeProbeSQL).Scan(&t)
		return t, err
	})
}

// checkServerVersion refuses a server older than PostgreSQL 12 (see
// pgsql.MinServerVersionNum), whose error would otherwise be a migration's
// syntax error.
func (d *Driver) checkServerVersion(ctx context.Context) error {
	return pgsql.CheckServerVersion(ctx, "pgdriver", func(ctx context.Context, q string) (num int, version string, err error) {
		err = d.pool.QueryRow(ctx, q).Scan(&num, &version)
		return num, version, err
	})
}

// CheckPrivileges returns nil when the role of the pool may do on idem's
// tables what idem's features do (SELECT, INSERT, UPDATE and DELETE on
// each, but no UPDATE on outbox, and SELECT on idem_migration; see the
// README's "Roles and privileges"), else an error naming each table, what
// the role lacks on it and the GRANT that gives it. Call it at start-up
// after Validate, in a service that runs as a role other than the tables'
// owner: a table a migration created without a grant for the role (no ALTER
// DEFAULT PRIVILEGES) would otherwise fail every request or batch that
// writes it, from the first one on. It is not part of Validate: a service
// that uses only some of idem's features may have been granted only their
// tables.
func (d *Driver) CheckPrivileges(ctx context.Context) error {
	return pgsql.CheckPrivileges(ctx, "pgdriver", d.names, func(ctx context.Context, sql string) ([]pgsql.MissingPrivilege, error) {
		rows, err := d.pool.Query(ctx, sql)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByPos[pgsql.MissingPrivilege])
	})
}

// TransactionPooling reports whether the driver keeps its claims' locks in
// their transactions, as behind a pooler in transaction mode it must:
// Config.TransactionPooling, or a pooler detected by Validate or by the
// first claim (see "Behind a connection pooler" in the package
// documentation).
func (d *Driver) TransactionPooling() bool { return d.pooled.Load() }

// lockKey returns the advisory lock that serialises migrators of one
// schema (whatever their prefixes: they share CREATE SCHEMA), and inbox
// partition changes. Without a configured schema it is the lock of the one
// tx's search_path resolves to (current_schema()), so that a driver naming
// the schema and one reaching it through search_path share it.
func (d *Driver) lockKey(ctx context.Context, tx pgx.Tx) (int64, error) {
	if d.cfg.Schema != "" {
		return d.names.MigrateLockKey(), nil
	}
	var schema string
	if err := tx.QueryRow(ctx, pgsql.CurrentSchemaSQL).Scan(&schema); err != nil {
		return 0, fmt.Errorf("current schema: %w", err)
	}
	return pgsql.MigrateLockKeyOf(schema), nil
}

// apply applies the rendered migrations ms not yet recorded, returning
// those it applied. own: tx is Migrate's own transaction, whose statements
// wait at most MigrationLockTimeout for a table lock (Migrate tries again);
// a caller's (MigrateTx) keeps its settings.
func (d *Driver) apply(ctx context.Context, tx pgx.Tx, ms []driver.Migration, own bool) ([]driver.Migration, error) {
	key, err := d.lockKey(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("pgdriver: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, pgsql.MigrationLockSQL, key); err != nil {
		return nil, fmt.Errorf("pgdriver: migrate: lock: %w", err)
	}
	if own {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+pgsql.MigrationLockTimeout+"'"); err != nil {
			return nil, fmt.Errorf("pgdriver: migrate: lock_timeout: %w", err)
		}
	}
	// Only when missing: an up-to-date database is left without DDL, in
	// MigrateTx too, so that a role without CREATE rights (the service's,
	// once a deployment step migrated) runs them.
	var hasTable bool
	if err := tx.QueryRow(ctx, pgsql.MigrationTableExistsSQL, d.names.MigrationTableName()).Scan(&hasTable); err != nil {
		return nil, fmt.Errorf("pgdriver: migrate: migration table: %w", err)
	}
	if !hasTable {
		if d.cfg.Schema != "" {
			// Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on
			// the database even when the schema exists, which the schema's
			// owner, migrating, may not have (see pgsql.CreateSchemaSQL).
			var exists bool
			if err := tx.QueryRow(ctx, pgsql.SchemaExistsSQL, d.cfg.Schema).Scan(&exists); err != nil {
				return nil, fmt.Errorf("pgdriver: migrate: schema: %w", err)
			}
			if !exists {
				if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{d.cfg.Schema}.Sanitize()); err != nil {
					return nil, fmt.Errorf("pgdriver: migrate: create schema: %w", pgsql.MigrateDenied(err))
				}
			}
		}
		if _, err := tx.Exec(ctx, d.expand(migrationTableSQL)); err != nil {
			return nil, fmt.Errorf("pgdriver: migrate: create migration table: %w", pgsql.MigrateDenied(err))
		}
	}
	var done []driver.Migration
	hasCompatible := false
	for _, m := range ms {
		var applied bool
		err := tx.QueryRow(ctx, d.expand(pgsql.MigrationAppliedSQL), m.Version).Scan(&applied)
		if err != nil {
			return nil, fmt.Errorf("pgdriver: migrate: %w", err)
		}
		if applied {
			continue
		}
		if !hasCompatible {
			// A table created before compatible_from: add it, once.
			if err := tx.QueryRow(ctx, pgsql.MigrationHasCompatibleSQL, d.names.MigrationTableName()).Scan(&hasCompatible); err != nil {
				return nil, fmt.Errorf("pgdriver: migrate: %w", err)
			}
			if !hasCompatible {
				if _, err := tx.Exec(ctx, d.expand(pgsql.MigrationCompatibleSQL)); err != nil {
					return nil, fmt.Errorf("pgdriver: migrate: add compatible_from: %w", pgsql.MigrateDenied(err))
				}
				hasCompatible = true
			}
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("pgdriver: migration %03d_%s: %w", m.Version, m.Name, pgsql.MigrateDenied(err))
		}
		if _, err := tx.Exec(ctx, d.expand(pgsql.MigrationRecordSQL), m.Version, m.Name, m.CompatibleFrom); err != nil {
			return nil, fmt.Errorf("pgdriver: migrate: record %d: %w", m.Version, err)
		}
		done = append(done, m)
	}
	return done, nil
}
