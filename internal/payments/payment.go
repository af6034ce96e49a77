package payments

import (
	"context"
	"errors"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/uniq"
)

// Payment statuses.
const (
	// StatusPending is the status of a payment created by POST
	// /v1/payments, and the default of NewPayment.Status.
	StatusPending = "PENDING"
	// StatusCaptured is the status of a payment whose money was taken:
	// the payments idemd's order saga charges.
	StatusCaptured = "CAPTURED"
)

// Limits of the payment fields.
const (
	// MaxTextLen is the longest provider or external payment id, in
	// characters.
	MaxTextLen = 128
	// AmountScale is the number of fractional digits stored
	// (numeric(19,4)).
	AmountScale = 4
	// AmountIntDigits is the largest number of integer digits of an amount
	// (19 - 4).
	AmountIntDigits = 15
)

// ReservedProviderPrefix starts the provider names of the payments idemd
// makes itself (the order saga's charges): POST /v1/payments refuses them
// (422, in any letter case), so that no client can create, in advance, the
// payment a charge would find under its (provider, external payment id).
const ReservedProviderPrefix = "idemd-"

// ProviderExternalIDKey is the UNIQUE constraint that makes a payment
// exist at most once per (provider, external payment id), whatever
// Idempotency-Key it was sent with. Every store's migration creates it
// under this name.
var ProviderExternalIDKey = uniq.Constraint{
	Name:    "payment_provider_external_id_key",
	Table:   "payment",
	Columns: []string{"payment_provider", "external_payment_id"},
}

// ErrNotFound is returned by Store.Get for an unknown id.
var ErrNotFound = errors.New("payments: payment not found")

// NewPayment is a validated request to create a payment.
type NewPayment struct {
	Provider   string
	ExternalID string
	// Amount is positive with at most AmountScale fractional digits and
	// AmountIntDigits integer digits.
	Amount     decimal.Decimal
	CustomerID int64
	// Status is the status the payment is created with; "" means
	// StatusPending.
	Status string
}

// StatusOrDefault returns p.Status, or StatusPending when it is empty.
func (p NewPayment) StatusOrDefault() string {
	if p.Status == "" {
		return StatusPending
	}
	return p.Status
}

// Payment is a stored payment.
type Payment struct {
	ID         int64
	Provider   string
	ExternalID string
	Amount     decimal.Decimal
	Status     string
	CustomerID int64
	CreatedAt  time.Time
}

// Same reports whether p is the payment np asks for: the same provider,
// external payment id, amount and customer (its status may have moved on).
// A stored payment found by np's provider and external payment id that is
// not the same is another operation that took that identity.
func (p *Payment) Same(np NewPayment) bool {
	return p.Provider == np.Provider && p.ExternalID == np.ExternalID &&
		p.Amount.Equal(np.Amount) && p.CustomerID == np.CustomerID
}

// Store keeps payments. TTx is the transaction type of the database library
// (pgx.Tx, *sql.Tx): CreateOrGet writes in the caller's transaction, which
// the idemhttp middleware commits together with the stored response.
type Store[TTx any] interface {
	// CreateOrGet inserts p with p.StatusOrDefault() in tx. When a payment with
	// p's provider and external id already exists it returns that one with
	// created=false instead (see uniq.CreateOrGet); tx stays usable.
	CreateOrGet(ctx context.Context, tx TTx, p NewPayment) (pay Payment, created bool, err error)
	// Get returns the committed payment with id, or ErrNotFound.
	Get(ctx context.Context, id int64) (Payment, error)
}
