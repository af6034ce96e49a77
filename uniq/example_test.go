package uniq_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/uniq"
)

// The payment table's second line of defence: a retry that arrives under a
// new Idempotency-Key finds the payment created by the first attempt.
func ExampleCreateOrGet() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	paymentKey := uniq.Constraint{
		Name:    "payment_provider_external_id_key",
		Table:   "payment",
		Columns: []string{"payment_provider", "external_payment_id"},
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	id, created, err := uniq.CreateOrGet(ctx, paymentKey,
		func(ctx context.Context) (id int64, err error) {
			// In a savepoint: the unique violation must not abort tx.
			err = uniq.SavepointTx(ctx, tx, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `INSERT INTO payment
					(payment_provider, external_payment_id, amount, status, customer_id)
					VALUES ($1, $2, $3, 'PENDING', $4) RETURNING id`,
					"sber", "ext-42", "100.5000", 7).Scan(&id)
			})
			return id, err
		},
		func(ctx context.Context) (id int64, err error) {
			err = tx.QueryRow(ctx, `SELECT id FROM payment
				WHERE payment_provider = $1 AND external_payment_id = $2`, "sber", "ext-42").Scan(&id)
			return id, err
		})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println(id, created) // created is false when the payment already existed
}
