package pgdriver

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate implements driver.Driver: it applies pending migrations, each in its
// own transaction.
func (d *Driver) Migrate(ctx context.Context) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	for _, m := range ms {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("pgdriver: migrate: %w", err)
		}
		if err := d.apply(ctx, tx, []driver.Migration{m}); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("pgdriver: migrate: commit: %w", err)
		}
	}
	return nil
}

// MigrateTx implements driver.Driver: it applies pending migrations in tx.
func (d *Driver) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return d.apply(ctx, tx, ms)
}

// lockKey is the advisory lock that serialises migrators of one schema
// (whatever their prefixes: they share CREATE SCHEMA).
func (d *Driver) lockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("idem-migrate:" + d.cfg.Schema))
	return int64(h.Sum64())
}

func (d *Driver) apply(ctx context.Context, tx pgx.Tx, ms []driver.Migration) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", d.lockKey()); err != nil {
		return fmt.Errorf("pgdriver: migrate: lock: %w", err)
	}
	if d.cfg.Schema != "" {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{d.cfg.Schema}.Sanitize()); err != nil {
			return fmt.Errorf("pgdriver: migrate: create schema: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, d.expand(`CREATE TABLE IF NOT EXISTS {{table}}idem_migration (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
		return fmt.Errorf("pgdriver: migrate: create migration table: %w", err)
	}
	for _, m := range ms {
		var applied bool
		err := tx.QueryRow(ctx, d.expand(`SELECT EXISTS (SELECT 1 FROM {{table}}idem_migration WHERE version = $1)`), m.Version).Scan(&applied)
		if err != nil {
			return fmt.Errorf("pgdriver: migrate: %w", err)
		}
		if applied {
			continue
		}
		if _, err := tx.Exec(ctx, d.expand(m.SQL)); err != nil {
			return fmt.Errorf("pgdriver: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, d.expand(`INSERT INTO {{table}}idem_migration (version, name) VALUES ($1, $2)`), m.Version, m.Name); err != nil {
			return fmt.Errorf("pgdriver: migrate: record %d: %w", m.Version, err)
		}
	}
	return nil
}
