package sqlitestore

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemkit/idem/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the pending orders migrations in one transaction (BEGIN
// IMMEDIATE with a database opened by sqlitedriver, which serialises
// concurrent migrators).
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := driver.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS order_migration (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ')))`); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	for _, m := range ms {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM order_migration WHERE version = ?`, m.Version).Scan(&n); err != nil {
			return fmt.Errorf("sqlitestore: migrate: %w", err)
		}
		if n > 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("sqlitestore: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO order_migration (version, name) VALUES (?, ?)`, m.Version, m.Name); err != nil {
			return fmt.Errorf("sqlitestore: migrate: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate: commit: %w", err)
	}
	return nil
}
