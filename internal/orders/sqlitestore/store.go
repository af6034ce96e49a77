package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/internal/orders"
)

// Store is the SQLite orders store.
type Store struct {
	db  *sql.DB
	now func() time.Time
}

var _ orders.Store[*sql.Tx] = (*Store)(nil)

// New returns a store on db; call Migrate before use.
func New(db *sql.DB) *Store { return &Store{db: db, now: time.Now} }

const columns = `id, customer_id, amount, status, items, created_at, payment_id`

// Create implements orders.Store.
func (s *Store) Create(ctx context.Context, tx *sql.Tx, o orders.NewOrder) (orders.Order, error) {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return orders.Order{}, fmt.Errorf("sqlitestore: create order: %w", err)
	}
	ord, err := scan(tx.QueryRowContext(ctx, `INSERT INTO customer_order
		(customer_id, amount, status, items, created_at) VALUES (?, ?, ?, ?, ?) RETURNING `+columns,
		o.CustomerID, o.Amount.StringFixed(orders.AmountScale), orders.StatusCreated, string(items),
		orders.FormatTime(s.now().Truncate(time.Microsecond))))
	if err != nil {
		return orders.Order{}, fmt.Errorf("sqlitestore: create order: %w", err)
	}
	return ord, nil
}

// Get implements orders.Store.
func (s *Store) Get(ctx context.Context, id int64) (orders.Order, error) {
	o, err := scan(s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM customer_order WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return orders.Order{}, orders.ErrNotFound
	}
	if err != nil {
		return orders.Order{}, fmt.Errorf("sqlitestore: get order %d: %w", id, err)
	}
	return o, nil
}

// GetTx implements orders.Store.
func (s *Store) GetTx(ctx context.Context, tx *sql.Tx, id int64) (orders.Order, error) {
	o, err := scan(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM customer_order WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return orders.Order{}, fmt.Errorf("sqlitestore: get order %d: %w", id, orders.ErrNotFound)
	}
	if err != nil {
		return orders.Order{}, fmt.Errorf("sqlitestore: get order %d: %w", id, err)
	}
	return o, nil
}

// Apply implements orders.Store: per customer, in ascending customer ID
// order, the new total is computed in Go (amounts are decimal TEXT) inside
// tx, a write transaction no other writer can interleave with, then
// upserted.
func (s *Store) Apply(ctx context.Context, tx *sql.Tx, deltas []orders.SummaryDelta) error {
	deltas = slices.Clone(deltas)
	orders.SortDeltas(deltas)
	now := orders.FormatTime(s.now().Truncate(time.Microsecond))
	for _, d := range deltas {
		if err := s.apply(ctx, tx, d, now); err != nil {
			return fmt.Errorf("sqlitestore: apply the summary delta of customer %d: %w", d.CustomerID, err)
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, tx *sql.Tx, d orders.SummaryDelta, now string) error {
	total := d.ConfirmedAmount
	var old string
	err := tx.QueryRowContext(ctx, `SELECT total_amount FROM customer_order_summary WHERE customer_id = ?`, d.CustomerID).Scan(&old)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	default:
		o, err := decimal.NewFromString(old)
		if err != nil {
			return fmt.Errorf("stored total %q: %w", old, err)
		}
		total = total.Add(o)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO customer_order_summary
			(customer_id, orders, confirmed, rejected, total_amount, last_order_id, updated_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
		ON CONFLICT (customer_id) DO UPDATE SET
			orders        = orders + excluded.orders,
			confirmed     = confirmed + excluded.confirmed,
			rejected      = rejected + excluded.rejected,
			total_amount  = excluded.total_amount,
			last_order_id = max(last_order_id, excluded.last_order_id),
			updated_at    = excluded.updated_at`,
		d.CustomerID, d.Orders, d.Confirmed, d.Rejected, total.StringFixed(orders.AmountScale), d.LastOrderID, now)
	return err
}

// Summary implements orders.Store.
func (s *Store) Summary(ctx context.Context, customerID int64) (orders.Summary, error) {
	var (
		sum            orders.Summary
		total, updated string
	)
	err := s.db.QueryRowContext(ctx, `SELECT customer_id, orders, confirmed, rejected, total_amount, last_order_id, updated_at
		FROM customer_order_summary WHERE customer_id = ?`, customerID).
		Scan(&sum.CustomerID, &sum.Orders, &sum.Confirmed, &sum.Rejected, &total, &sum.LastOrderID, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return orders.Summary{}, orders.ErrNotFound
	}
	if err == nil {
		sum.TotalAmount, err = decimal.NewFromString(total)
	}
	if err == nil {
		sum.UpdatedAt, err = time.Parse(time.RFC3339Nano, updated)
	}
	if err != nil {
		return orders.Summary{}, fmt.Errorf("sqlitestore: summary of customer %d: %w", customerID, err)
	}
	sum.UpdatedAt = sum.UpdatedAt.UTC()
	return sum, nil
}

// SetStatus implements orders.Store.
func (s *Store) SetStatus(ctx context.Context, tx *sql.Tx, id int64, status string) error {
	return s.update(ctx, tx, "status", `UPDATE customer_order SET status = ? WHERE id = ?`, status, id)
}

// SetPayment implements orders.Store.
func (s *Store) SetPayment(ctx context.Context, tx *sql.Tx, id, paymentID int64) error {
	return s.update(ctx, tx, "payment", `UPDATE customer_order SET payment_id = ? WHERE id = ?`, paymentID, id)
}

// update runs an UPDATE of the order id (the last argument).
func (s *Store) update(ctx context.Context, tx *sql.Tx, what, query string, value any, id int64) error {
	res, err := tx.ExecContext(ctx, query, value, id)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		err = orders.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("sqlitestore: set %s of order %d: %w", what, id, err)
	}
	return nil
}

func scan(row *sql.Row) (orders.Order, error) {
	var (
		o                        orders.Order
		amount, items, createdAt string
		payment                  sql.NullInt64
	)
	if err := row.Scan(&o.ID, &o.CustomerID, &amount, &o.Status, &items, &createdAt, &payment); err != nil {
		return orders.Order{}, err
	}
	d, err := decimal.NewFromString(amount)
	if err != nil {
		return orders.Order{}, fmt.Errorf("stored amount %q: %w", amount, err)
	}
	if err := json.Unmarshal([]byte(items), &o.Items); err != nil {
		return orders.Order{}, fmt.Errorf("stored items: %w", err)
	}
	t, err := time.Parse(time.RFC3339Nano, createdAt)
	if err != nil {
		return orders.Order{}, fmt.Errorf("stored created_at %q: %w", createdAt, err)
	}
	o.Amount, o.CreatedAt, o.PaymentID = d, t.UTC(), payment.Int64
	return o, nil
}
