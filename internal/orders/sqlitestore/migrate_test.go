package sqlitestore

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemkit/idem/internal/appmigrate"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/testdb"
)

// before003 is the migrations up to 002: the schema before the summary
// counted outcomes.
func before003(t *testing.T) fs.FS { return migrationsBefore(t, 3) }

// migrationsBefore is the embedded migrations older than version: the
// schema an older idemd left.
func migrationsBefore(t *testing.T, version int) fs.FS {
	t.Helper()
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	old := fstest.MapFS{}
	for _, e := range entries {
		var v int
		if _, err := fmt.Sscanf(e.Name(), "%d_", &v); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if v >= version {
			continue
		}
		b, err := fs.ReadFile(migrationFS, "migrations/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		old["migrations/"+e.Name()] = &fstest.MapFile{Data: b}
	}
	return old
}

// Migration 003 rebuilds the summary table and recomputes the outcomes of
// the existing summaries from the orders' statuses, adding the decimal
// TEXT amounts exactly: total_amount counted every order, it now counts
// the confirmed ones only.
func TestMigrate003RecomputesSummaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t).DB()
	if err := appmigrate.SQLite(ctx, db, before003(t), "migrations", "order_migration"); err != nil {
		t.Fatal(err)
	}
	order := func(customer int64, amount, status string) int64 {
		t.Helper()
		var id int64
		if err := db.QueryRowContext(ctx, `INSERT INTO customer_order (customer_id, amount, status, items, created_at)
			VALUES (?, ?, ?, '[]', '2025-01-01T00:00:00.000000Z') RETURNING id`, customer, amount, status).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	const at = "2025-01-01T00:00:00.000000Z"
	// Customer 1: all three orders projected, one confirmed, one rejected.
	order(1, "10.5000", orders.StatusConfirmed)
	order(1, "20000.0000", orders.StatusRejected)
	last1 := order(1, "3.0000", orders.StatusCreated)
	exec(`INSERT INTO customer_order_summary (customer_id, orders, total_amount, last_order_id, updated_at) VALUES (1, 3, '20013.5000', ?, ?)`, last1, at)
	// Customer 2: one order, pending.
	last2 := order(2, "7.0000", orders.StatusCreated)
	exec(`INSERT INTO customer_order_summary (customer_id, orders, total_amount, last_order_id, updated_at) VALUES (2, 1, '7.0000', ?, ?)`, last2, at)
	// Customer 3: three orders confirmed, their creation not projected
	// yet; the fractions carry into the units.
	order(3, "999999999999999.9999", orders.StatusConfirmed)
	order(3, "0.0002", orders.StatusConfirmed)
	last3 := order(3, "0.9999", orders.StatusConfirmed)

	s := New(db)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate to 003: %v", err)
	}
	for _, want := range []string{
		fmt.Sprintf("customer 1: orders 3 pending 1 confirmed 1 rejected 1 total 10.5000 last %d", last1),
		fmt.Sprintf("customer 2: orders 1 pending 1 confirmed 0 rejected 0 total 0.0000 last %d", last2),
		fmt.Sprintf("customer 3: orders 0 pending 0 confirmed 3 rejected 0 total 1000000000000001.0000 last %d", last3),
	} {
		var c int64
		_, _ = fmt.Sscanf(want, "customer %d:", &c)
		sum, err := s.Summary(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("customer %d: orders %d pending %d confirmed %d rejected %d total %s last %d",
			sum.CustomerID, sum.Orders, sum.Pending(), sum.Confirmed, sum.Rejected, sum.TotalAmount.StringFixed(4), sum.LastOrderID)
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
		if sum.UpdatedAt.IsZero() {
			t.Errorf("customer %d: no updated_at", c)
		}
	}
	// The rebuilt table keeps its CHECKs, relaxed to zero.
	for _, q := range []string{
		`UPDATE customer_order_summary SET orders = -1 WHERE customer_id = 1`,
		`UPDATE customer_order_summary SET rejected = -1 WHERE customer_id = 1`,
		`UPDATE customer_order_summary SET total_amount = '1.5' WHERE customer_id = 1`,
		`UPDATE customer_order_summary SET total_amount = 1.5 WHERE customer_id = 1`,
	} {
		if _, err := db.ExecContext(ctx, q); err == nil || !strings.Contains(strings.ToLower(err.Error()), "constraint") {
			t.Errorf("%s: %v, want a constraint violation", q, err)
		}
	}
}

// Migration 005 makes a database migrated by an older idemd refuse
// non-positive order amounts like PostgreSQL's CHECK (amount > 0), on
// INSERT and on UPDATE, keeping the orders it holds.
func TestMigrate005RefusesNonPositiveAmounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t).DB()
	if err := appmigrate.SQLite(ctx, db, migrationsBefore(t, 5), "migrations", "order_migration"); err != nil {
		t.Fatal(err)
	}
	insert := func(amount string) (id int64, err error) {
		err = db.QueryRowContext(ctx, `INSERT INTO customer_order (customer_id, amount, status, items, created_at)
			VALUES (1, ?, 'CREATED', '[]', '2025-01-01T00:00:00.000000Z') RETURNING id`, amount).Scan(&id)
		return id, err
	}
	id, err := insert("12.3400")
	if err != nil {
		t.Fatal(err)
	}

	s := New(db)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate to 005: %v", err)
	}
	var versions int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM order_migration`).Scan(&versions); err != nil || versions != 5 {
		t.Fatalf("%d versions recorded (%v), want 5", versions, err)
	}
	o, err := s.Get(ctx, id)
	if err != nil || o.Amount.StringFixed(4) != "12.3400" {
		t.Fatalf("existing order after the migration: %+v, %v", o, err)
	}

	// The triggers run before 001's format CHECK: they refuse a sign too.
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "order amount must be positive") {
			t.Errorf("%s: %v, want %q", what, err, "order amount must be positive")
		}
	}
	for _, amount := range []string{"0.0000", "000.0000", "-1.0000", "-0.0001"} {
		_, err := insert(amount)
		refused("insert "+amount, err)
		_, err = db.ExecContext(ctx, `UPDATE customer_order SET amount = ? WHERE id = ?`, amount, id)
		refused("update to "+amount, err)
	}
	if _, err := insert("0.0001"); err != nil {
		t.Errorf("insert 0.0001: %v", err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE customer_order SET amount = '0.0010', status = 'CONFIRMED' WHERE id = ?`, id); err != nil {
		t.Errorf("update to a positive amount: %v", err)
	}
}
