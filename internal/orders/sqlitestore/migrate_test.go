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
func before003(t *testing.T) fs.FS {
	t.Helper()
	old := fstest.MapFS{}
	for _, name := range []string{"001_customer_order.sql", "002_order_payment.sql"} {
		b, err := fs.ReadFile(migrationFS, "migrations/"+name)
		if err != nil {
			t.Fatal(err)
		}
		old["migrations/"+name] = &fstest.MapFile{Data: b}
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
