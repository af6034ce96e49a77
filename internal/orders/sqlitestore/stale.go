package sqlitestore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/orders"
)

var _ orders.StaleLister = (*Store)(nil)

// ListCreatedBefore implements orders.StaleLister through the partial index
// on CREATED orders (created_at is TimeFormat text, which sorts as time).
func (s *Store) ListCreatedBefore(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
	// INDEXED BY: without statistics (nothing runs ANALYZE) SQLite would
	// walk the primary key from afterID, every order of the table, rather
	// than the few CREATED ones of the partial index.
	rows, err := s.db.QueryContext(ctx, `SELECT id, created_at FROM customer_order INDEXED BY customer_order_created_idx
		WHERE status = 'CREATED' AND created_at < ? AND id > ? ORDER BY id LIMIT ?`, orders.FormatTime(before), afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: list stale orders: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []orders.Stale
	for rows.Next() {
		var (
			st orders.Stale
			at string
		)
		if err := rows.Scan(&st.ID, &at); err != nil {
			return nil, fmt.Errorf("sqlitestore: list stale orders: %w", err)
		}
		if st.CreatedAt, err = time.Parse(orders.TimeFormat, at); err != nil {
			return nil, fmt.Errorf("sqlitestore: list stale orders: created_at %q: %w", at, err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: list stale orders: %w", err)
	}
	return out, nil
}
