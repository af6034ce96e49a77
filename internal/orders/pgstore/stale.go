package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/orders"
)

var _ orders.StaleLister = (*Store)(nil)

// ListCreatedBefore implements orders.StaleLister through the partial index
// on CREATED orders.
func (s *Store) ListCreatedBefore(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, created_at FROM customer_order
		WHERE status = 'CREATED' AND created_at < $1 AND id > $2 ORDER BY id LIMIT $3`, before, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list stale orders: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (orders.Stale, error) {
		var st orders.Stale
		err := row.Scan(&st.ID, &st.CreatedAt)
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list stale orders: %w", err)
	}
	return out, nil
}
