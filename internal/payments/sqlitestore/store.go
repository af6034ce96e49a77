package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/uniq"
)

// Store is the SQLite payments.Store.
type Store struct {
	db  *sql.DB
	now func() time.Time
}

var _ payments.Store[*sql.Tx] = (*Store)(nil)

// New returns a store on db, the *sql.DB of a sqlitedriver.Driver. Run
// Migrate before use.
func New(db *sql.DB) *Store { return &Store{db: db, now: time.Now} }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

const columns = `id, payment_provider, external_payment_id, amount, status, customer_id, created_at`

// CreateOrGet implements payments.Store.
func (s *Store) CreateOrGet(ctx context.Context, tx *sql.Tx, p payments.NewPayment) (payments.Payment, bool, error) {
	created := payments.FormatTime(s.now().Truncate(time.Microsecond))
	pay, isNew, err := uniq.CreateOrGet(ctx, payments.ProviderExternalIDKey,
		func(ctx context.Context) (payments.Payment, error) {
			return scan(tx.QueryRowContext(ctx, `INSERT INTO payment
				(payment_provider, external_payment_id, amount, status, customer_id, created_at)
				VALUES (?, ?, ?, ?, ?, ?) RETURNING `+columns,
				p.Provider, p.ExternalID, p.Amount.StringFixed(payments.AmountScale), p.StatusOrDefault(), p.CustomerID, created))
		},
		func(ctx context.Context) (payments.Payment, error) {
			return scan(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM payment
				WHERE payment_provider = ? AND external_payment_id = ?`, p.Provider, p.ExternalID))
		})
	if err != nil {
		return payments.Payment{}, false, fmt.Errorf("sqlitestore: create payment: %w", err)
	}
	return pay, isNew, nil
}

// Get implements payments.Store.
func (s *Store) Get(ctx context.Context, id int64) (payments.Payment, error) {
	p, err := scan(s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM payment WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return payments.Payment{}, payments.ErrNotFound
	}
	if err != nil {
		return payments.Payment{}, fmt.Errorf("sqlitestore: get payment %d: %w", id, err)
	}
	return p, nil
}

func scan(row *sql.Row) (payments.Payment, error) {
	var (
		p                 payments.Payment
		amount, createdAt string
	)
	if err := row.Scan(&p.ID, &p.Provider, &p.ExternalID, &amount, &p.Status, &p.CustomerID, &createdAt); err != nil {
		return payments.Payment{}, err
	}
	d, err := decimal.NewFromString(amount)
	if err != nil {
		return payments.Payment{}, fmt.Errorf("stored amount %q: %w", amount, err)
	}
	t, err := time.Parse(time.RFC3339Nano, createdAt)
	if err != nil {
		return payments.Payment{}, fmt.Errorf("stored created_at %q: %w", createdAt, err)
	}
	p.Amount, p.CreatedAt = d, t.UTC()
	return p, nil
}
