package sqlitedriver

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/idemkit/idem/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate implements driver.Driver. Each migration runs in its own
// transaction; BEGIN IMMEDIATE serialises concurrent migrators.
func (d *Driver) Migrate(ctx context.Context) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	for _, m := range ms {
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("sqlitedriver: migrate: %w", err)
		}
		if err := d.apply(ctx, tx, []driver.Migration{m}); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("sqlitedriver: migrate: commit: %w", err)
		}
	}
	return nil
}

// MigrateTx implements driver.Driver.
func (d *Driver) MigrateTx(ctx context.Context, tx *sql.Tx) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return d.apply(ctx, tx, ms)
}

func (d *Driver) apply(ctx context.Context, tx *sql.Tx, ms []driver.Migration) error {
	if _, err := tx.ExecContext(ctx, d.expand(`CREATE TABLE IF NOT EXISTS {{table}}idem_migration (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at INTEGER NOT NULL)`)); err != nil {
		return fmt.Errorf("sqlitedriver: migrate: create migration table: %w", err)
	}
	for _, m := range ms {
		var n int
		if err := tx.QueryRowContext(ctx, d.expand(`SELECT count(*) FROM {{table}}idem_migration WHERE version = ?`), m.Version).Scan(&n); err != nil {
			return fmt.Errorf("sqlitedriver: migrate: %w", err)
		}
		if n > 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, d.expand(m.SQL)); err != nil {
			return fmt.Errorf("sqlitedriver: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, d.expand(`INSERT INTO {{table}}idem_migration (version, name, applied_at)
			VALUES (?, ?, unixepoch('subsec') * 1000000)`), m.Version, m.Name); err != nil {
			return fmt.Errorf("sqlitedriver: migrate: record %d: %w", m.Version, err)
		}
	}
	return nil
}
