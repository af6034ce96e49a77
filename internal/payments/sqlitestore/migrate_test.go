package sqlitestore

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemkit/idem/internal/appmigrate"
	"github.com/idemkit/idem/internal/testdb"
)

// Migration 002 makes a database migrated by an older idemd refuse
// non-positive amounts like PostgreSQL's CHECK (amount > 0), on INSERT and
// on UPDATE, keeping the payments it holds.
func TestMigrate002RefusesNonPositiveAmounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t).DB()
	b, err := fs.ReadFile(migrationFS, "migrations/001_payment.sql")
	if err != nil {
		t.Fatal(err)
	}
	old := fstest.MapFS{"migrations/001_payment.sql": &fstest.MapFile{Data: b}}
	if err := appmigrate.SQLite(ctx, db, old, "migrations", "payment_migration"); err != nil {
		t.Fatal(err)
	}
	insert := func(ext, amount string) error {
		_, err := db.ExecContext(ctx, `INSERT INTO payment
			(payment_provider, external_payment_id, amount, status, customer_id, created_at)
			VALUES ('p', ?, ?, 'PENDING', 1, '2025-01-01T00:00:00.000000Z')`, ext, amount)
		return err
	}
	if err := insert("old", "12.3400"); err != nil {
		t.Fatal(err)
	}

	s := New(db)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate to 002: %v", err)
	}
	var versions int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payment_migration`).Scan(&versions); err != nil || versions != 2 {
		t.Fatalf("%d versions recorded (%v), want 2", versions, err)
	}
	p, err := s.Get(ctx, 1)
	if err != nil || p.Amount.StringFixed(4) != "12.3400" {
		t.Fatalf("existing payment after the migration: %+v, %v", p, err)
	}

	// The triggers run before 001's format CHECK: they refuse a sign too.
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "payment amount must be positive") {
			t.Errorf("%s: %v, want %q", what, err, "payment amount must be positive")
		}
	}
	for _, amount := range []string{"0.0000", "000.0000", "-1.0000", "-0.0001"} {
		refused("insert "+amount, insert("new-"+amount, amount))
		_, err := db.ExecContext(ctx, `UPDATE payment SET amount = ? WHERE id = 1`, amount)
		refused("update to "+amount, err)
	}
	for _, amount := range []string{"0.0001", "1000000.0000"} {
		if err := insert("new-"+amount, amount); err != nil {
			t.Errorf("insert %s: %v", amount, err)
		}
	}
	if _, err := db.ExecContext(ctx, `UPDATE payment SET amount = '0.0010', status = 'CAPTURED' WHERE id = 1`); err != nil {
		t.Errorf("update to a positive amount: %v", err)
	}
}
