package uniq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/problem"
	"github.com/idemkit/idem/uniq"
)

// The payment table's second line of defence: a retry that arrives under a
// new Idempotency-Key finds the payment created by the first attempt. The
// savepoint taken by hand here is what CreateOrGetTx takes in one call.
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

// In an idemhttp ModeTx handler: the payment, its event and the stored
// response commit together; a request for an existing payment under
// another key answers 200 with it, and emits nothing. One whose provider
// and external id are taken by a payment with another amount or customer
// is another operation: 409, nothing created (a 200 would tell its client
// that its payment exists).
//
// With pgsqldriver or sqlitedriver the transaction is a *sql.Tx
// (idemhttp.TxFromContext[*sql.Tx]): the same with uniq.CreateOrGetSQLTx.
func ExampleCreateOrGetTx_idemhttp() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	drv, err := pgdriver.New(pool, nil)
	if err != nil {
		panic(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		panic(err)
	}
	paymentKey := uniq.Constraint{
		Name:    "payment_provider_external_id_key",
		Table:   "payment",
		Columns: []string{"payment_provider", "external_payment_id"},
	}
	type payment struct {
		ID         int64           `json:"id"`
		Provider   string          `json:"provider"`
		ExternalID string          `json:"external_payment_id"`
		Amount     decimal.Decimal `json:"amount"` // never a float
		CustomerID int64           `json:"customer_id"`
	}
	mw, err := idemhttp.New(drv, &idemhttp.Config{
		// The principal your authentication middleware found (mounted
		// before idem, below), never a header the client chooses: a
		// client naming another's principal would get its stored
		// responses. "" answers 401.
		Scope: func(r *http.Request) (string, error) {
			client, _ := r.Context().Value(clientIDKey{}).(string)
			return client, nil
		},
	})
	if err != nil {
		panic(err)
	}
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := payment{Provider: "sber", ExternalID: "ext-42", Amount: decimal.RequireFromString("100.50"), CustomerID: 7} // decoded from r.Body
		tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
		// create runs in a savepoint of tx: a duplicate rolls back only
		// the INSERT, and get reads the winner's row in tx.
		p, created, err := uniq.CreateOrGetTx(r.Context(), tx, paymentKey,
			func(ctx context.Context, tx pgx.Tx) (p payment, err error) {
				p = in
				err = tx.QueryRow(ctx, `INSERT INTO payment (payment_provider, external_payment_id, amount, customer_id)
					VALUES ($1, $2, $3::numeric, $4) RETURNING id`, p.Provider, p.ExternalID, p.Amount.String(), p.CustomerID).Scan(&p.ID)
				return p, err
			},
			func(ctx context.Context, tx pgx.Tx) (p payment, err error) {
				// The stored row, whatever this request sent.
				var amount string
				p.Provider, p.ExternalID = in.Provider, in.ExternalID
				err = tx.QueryRow(ctx, `SELECT id, amount::text, customer_id FROM payment
					WHERE payment_provider = $1 AND external_payment_id = $2`, p.Provider, p.ExternalID).Scan(&p.ID, &amount, &p.CustomerID)
				if err == nil {
					p.Amount, err = decimal.NewFromString(amount)
				}
				return p, err
			})
		if err == nil && !created && (!p.Amount.Equal(in.Amount) || p.CustomerID != in.CustomerID) {
			// Another operation holds this provider and external id.
			// A 4xx is stored under the key: a retry gets it again.
			problem.Write(w, problem.Problem{Type: problem.TypeConflict, Status: http.StatusConflict,
				Title:  "Payment exists with other details",
				Detail: "Nothing was created: payment " + strconv.FormatInt(p.ID, 10) + " has this provider and external_payment_id."})
			return
		}
		if err == nil && created {
			var e event.Envelope
			if e, err = event.New("PaymentCreated.v1", strconv.FormatInt(p.ID, 10), p); err == nil {
				err = outbox.EnqueueTx(r.Context(), drv, tx, e)
			}
		}
		if err != nil {
			http.Error(w, "storage error", http.StatusInternalServerError) // rolled back, not stored
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if created {
			w.WriteHeader(http.StatusCreated)
		}
		_ = json.NewEncoder(w).Encode(p)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(mw.Handler(create)))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// clientIDKey holds the authenticated client's ID in a request's context.
type clientIDKey struct{}

// authenticate stands for your authentication middleware: it checks the
// credentials and puts the client's stable ID in the context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, ok := clientOf(r.Header.Get("Authorization")) // your token or API key check
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientIDKey{}, client)))
	})
}

func clientOf(authorization string) (string, bool) {
	token, ok := strings.CutPrefix(authorization, "Bearer ")
	return token, ok && token != "" // a real check looks the token up
}
