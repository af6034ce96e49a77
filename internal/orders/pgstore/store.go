package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/internal/orders"
)

// Store is the PostgreSQL orders store.
type Store struct {
	pool *pgxpool.Pool
}

var _ orders.Store[pgx.Tx] = (*Store)(nil)

// New returns a store on pool; call Migrate before use.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

const columns = `id, customer_id, amount::text, status, items::text, created_at, payment_id`

// Create implements orders.Store.
func (s *Store) Create(ctx context.Context, tx pgx.Tx, o orders.NewOrder) (orders.Order, error) {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return orders.Order{}, fmt.Errorf("pgstore: create order: %w", err)
	}
	ord, err := scan(tx.QueryRow(ctx, `INSERT INTO customer_order (customer_id, amount, status, items)
		VALUES ($1, $2::numeric, $3, $4::jsonb) RETURNING `+columns,
		o.CustomerID, o.Amount.StringFixed(orders.AmountScale), orders.StatusCreated, string(items)))
	if err != nil {
		return orders.Order{}, fmt.Errorf("pgstore: create order: %w", err)
	}
	return ord, nil
}

// Get implements orders.Store.
func (s *Store) Get(ctx context.Context, id int64) (orders.Order, error) {
	o, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM customer_order WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return orders.Order{}, orders.ErrNotFound
	}
	if err != nil {
		return orders.Order{}, fmt.Errorf("pgstore: get order %d: %w", id, err)
	}
	return o, nil
}

// GetTx implements orders.Store.
func (s *Store) GetTx(ctx context.Context, tx pgx.Tx, id int64) (orders.Order, error) {
	o, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM customer_order WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return orders.Order{}, fmt.Errorf("pgstore: get order %d: %w", id, orders.ErrNotFound)
	}
	if err != nil {
		return orders.Order{}, fmt.Errorf("pgstore: get order %d: %w", id, err)
	}
	return o, nil
}

// applyDelta is the upsert of one customer's delta. Each statement locks
// one summary row; Apply sends them in ascending customer ID order.
const applyDelta = `INSERT INTO customer_order_summary AS s
		(customer_id, orders, confirmed, rejected, total_amount, last_order_id)
	VALUES ($1, $2, $3, $4, $5::numeric, $6)
	ON CONFLICT (customer_id) DO UPDATE SET
		orders        = s.orders + excluded.orders,
		confirmed     = s.confirmed + excluded.confirmed,
		rejected      = s.rejected + excluded.rejected,
		total_amount  = s.total_amount + excluded.total_amount,
		last_order_id = greatest(s.last_order_id, excluded.last_order_id),
		updated_at    = now()`

// Apply implements orders.Store: one upsert per customer, in ascending
// customer ID order, sent in one pipelined batch (one round trip).
func (s *Store) Apply(ctx context.Context, tx pgx.Tx, deltas []orders.SummaryDelta) error {
	if len(deltas) == 0 {
		return nil
	}
	deltas = slices.Clone(deltas)
	orders.SortDeltas(deltas)
	b := &pgx.Batch{}
	for _, d := range deltas {
		b.Queue(applyDelta, d.CustomerID, d.Orders, d.Confirmed, d.Rejected,
			d.ConfirmedAmount.StringFixed(orders.AmountScale), d.LastOrderID)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: apply %d summary deltas: %w", len(deltas), err)
	}
	return nil
}

// Summary implements orders.Store.
func (s *Store) Summary(ctx context.Context, customerID int64) (orders.Summary, error) {
	var (
		sum   orders.Summary
		total string
	)
	err := s.pool.QueryRow(ctx, `SELECT customer_id, orders, confirmed, rejected, total_amount::text, last_order_id, updated_at
		FROM customer_order_summary WHERE customer_id = $1`, customerID).
		Scan(&sum.CustomerID, &sum.Orders, &sum.Confirmed, &sum.Rejected, &total, &sum.LastOrderID, &sum.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return orders.Summary{}, orders.ErrNotFound
	}
	if err == nil {
		sum.TotalAmount, err = decimal.NewFromString(total)
	}
	if err != nil {
		return orders.Summary{}, fmt.Errorf("pgstore: summary of customer %d: %w", customerID, err)
	}
	sum.UpdatedAt = sum.UpdatedAt.UTC()
	return sum, nil
}

// SetStatus implements orders.Store.
func (s *Store) SetStatus(ctx context.Context, tx pgx.Tx, id int64, status string) error {
	tag, err := tx.Exec(ctx, `UPDATE customer_order SET status = $2 WHERE id = $1`, id, status)
	if err != nil {
		return fmt.Errorf("pgstore: set status of order %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: set status of order %d: %w", id, orders.ErrNotFound)
	}
	return nil
}

// SetPayment implements orders.Store.
func (s *Store) SetPayment(ctx context.Context, tx pgx.Tx, id, paymentID int64) error {
	tag, err := tx.Exec(ctx, `UPDATE customer_order SET payment_id = $2 WHERE id = $1`, id, paymentID)
	if err != nil {
		return fmt.Errorf("pgstore: set payment of order %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: set payment of order %d: %w", id, orders.ErrNotFound)
	}
	return nil
}

func scan(row pgx.Row) (orders.Order, error) {
	var (
		o             orders.Order
		amount, items string
		created       time.Time
		payment       *int64
	)
	if err := row.Scan(&o.ID, &o.CustomerID, &amount, &o.Status, &items, &created, &payment); err != nil {
		return orders.Order{}, err
	}
	d, err := decimal.NewFromString(amount)
	if err != nil {
		return orders.Order{}, fmt.Errorf("stored amount %q: %w", amount, err)
	}
	if err := json.Unmarshal([]byte(items), &o.Items); err != nil {
		return orders.Order{}, fmt.Errorf("stored items: %w", err)
	}
	o.Amount, o.CreatedAt = d, created.UTC()
	if payment != nil {
		o.PaymentID = *payment
	}
	return o, nil
}
