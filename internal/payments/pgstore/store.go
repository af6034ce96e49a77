package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/internal/payments"
	"github.com/idemkit/idem/uniq"
)

// Store is the PostgreSQL payments.Store.
type Store struct {
	pool *pgxpool.Pool
}

var _ payments.Store[pgx.Tx] = (*Store)(nil)

// New returns a store on pool. Run Migrate before use.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

const columns = `id, payment_provider, external_payment_id, amount::text, status, customer_id, created_at`

// CreateOrGet implements payments.Store.
func (s *Store) CreateOrGet(ctx context.Context, tx pgx.Tx, p payments.NewPayment) (payments.Payment, bool, error) {
	pay, created, err := uniq.CreateOrGetTx(ctx, tx, payments.ProviderExternalIDKey,
		func(ctx context.Context, tx pgx.Tx) (payments.Payment, error) {
			return scan(tx.QueryRow(ctx, `INSERT INTO payment
				(payment_provider, external_payment_id, amount, status, customer_id)
				VALUES ($1, $2, $3::numeric, $4, $5) RETURNING `+columns,
				p.Provider, p.ExternalID, p.Amount.StringFixed(payments.AmountScale), p.StatusOrDefault(), p.CustomerID))
		},
		func(ctx context.Context, tx pgx.Tx) (payments.Payment, error) {
			return scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM payment
				WHERE payment_provider = $1 AND external_payment_id = $2`, p.Provider, p.ExternalID))
		})
	if err != nil {
		return payments.Payment{}, false, fmt.Errorf("pgstore: create payment: %w", err)
	}
	return pay, created, nil
}

// Get implements payments.Store.
func (s *Store) Get(ctx context.Context, id int64) (payments.Payment, error) {
	p, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM payment WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return payments.Payment{}, payments.ErrNotFound
	}
	if err != nil {
		return payments.Payment{}, fmt.Errorf("pgstore: get payment %d: %w", id, err)
	}
	return p, nil
}

func scan(row pgx.Row) (payments.Payment, error) {
	var (
		p      payments.Payment
		amount string
	)
	if err := row.Scan(&p.ID, &p.Provider, &p.ExternalID, &amount, &p.Status, &p.CustomerID, &p.CreatedAt); err != nil {
		return payments.Payment{}, err
	}
	d, err := decimal.NewFromString(amount)
	if err != nil {
		return payments.Payment{}, fmt.Errorf("stored amount %q: %w", amount, err)
	}
	p.Amount = d
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}
