package orders

import (
	"context"
	"errors"
	"time"

	"github.com/shopspring/decimal"
)

// Order statuses. An order is CREATED by POST /v1/orders; the order
// payment saga then makes it CONFIRMED (its payment was captured) or
// REJECTED (the payment failed for good).
const (
	StatusCreated   = "CREATED"
	StatusConfirmed = "CONFIRMED"
	StatusRejected  = "REJECTED"
)

// The order events, all keyed by the order ID (so one order's events share
// a partition).
const (
	// EventOrderCreated is the type of the event enqueued with every new
	// order.
	EventOrderCreated = "OrderCreated.v1"
	// EventOrderConfirmed is emitted by the payment saga's confirm-order
	// step when it sets the order CONFIRMED.
	EventOrderConfirmed = "OrderConfirmed.v1"
	// EventOrderRejected is emitted by the compensation of the saga's
	// place-order step when it sets the order REJECTED.
	EventOrderRejected = "OrderRejected.v1"
)

// Limits of a request.
const (
	// AmountScale is the number of fractional digits stored.
	AmountScale = 4
	// AmountIntDigits bounds the integer digits of an amount
	// (numeric(19,4)).
	AmountIntDigits = 15
	MaxItems        = 100
	MaxSKULen       = 64
	MaxQuantity     = 1000
)

// ErrNotFound is returned by Get and Summary when there is no such row.
var ErrNotFound = errors.New("orders: not found")

// Item is one line of an order.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// NewOrder is a validated request.
type NewOrder struct {
	CustomerID int64
	Amount     decimal.Decimal
	Items      []Item
}

// Order is a stored order.
type Order struct {
	ID         int64
	CustomerID int64
	Amount     decimal.Decimal
	Status     string
	Items      []Item
	CreatedAt  time.Time
	// PaymentID is the payment the order saga charged, 0 before.
	PaymentID int64
}

// Summary is a customer's row of the projection. Every field only grows,
// one event at a time, so the events of an order may be applied in any
// order (see SummaryDelta).
type Summary struct {
	CustomerID int64
	// Orders counts the OrderCreated.v1 events applied, Confirmed the
	// OrderConfirmed.v1, Rejected the OrderRejected.v1.
	Orders    int64
	Confirmed int64
	Rejected  int64
	// TotalAmount is the sum of the amounts of the confirmed orders.
	TotalAmount decimal.Decimal
	// LastOrderID is the greatest order ID of the events applied.
	LastOrderID int64
	UpdatedAt   time.Time
}

// Pending is the number of orders neither confirmed nor rejected yet:
// Orders - Confirmed - Rejected, never below 0 (an order's confirmation
// may be applied before its creation).
func (s Summary) Pending() int64 { return max(0, s.Orders-s.Confirmed-s.Rejected) }

// SummaryDelta is what a set of events adds to a customer's summary. The
// projection only ever adds deltas, which commute: the result does not
// depend on the order the events arrive in.
type SummaryDelta struct {
	CustomerID int64
	Orders     int64
	Confirmed  int64
	Rejected   int64
	// ConfirmedAmount is added to Summary.TotalAmount.
	ConfirmedAmount decimal.Decimal
	// LastOrderID is the greatest order ID of the events (0 if none).
	LastOrderID int64
}

// Store stores orders and the projection. TTx is the transaction type of
// the database's idem driver.
type Store[TTx any] interface {
	// Create inserts an order with StatusCreated through tx.
	Create(ctx context.Context, tx TTx, o NewOrder) (Order, error)
	// Get reads an order, or returns ErrNotFound.
	Get(ctx context.Context, id int64) (Order, error)
	// GetTx reads an order through tx, or returns ErrNotFound.
	GetTx(ctx context.Context, tx TTx, id int64) (Order, error)
	// Apply adds each delta to its customer's summary through tx (an
	// upsert per customer; a customer without a row gets one, with zero
	// orders if the delta has none). Deltas must name distinct customers;
	// they are applied in ascending CustomerID order whatever their order
	// in the slice, so concurrent transactions lock the summary rows in
	// the same order and never deadlock. It is not idempotent by itself:
	// the inbox applies each event once.
	Apply(ctx context.Context, tx TTx, deltas []SummaryDelta) error
	// Summary reads a customer's summary, or returns ErrNotFound.
	Summary(ctx context.Context, customerID int64) (Summary, error)
	// SetStatus sets the status of order id through tx, or returns
	// ErrNotFound. Setting the status it has is a no-op: it is idempotent.
	SetStatus(ctx context.Context, tx TTx, id int64, status string) error
	// SetPayment records through tx the payment charged for order id, or
	// returns ErrNotFound. It is idempotent.
	SetPayment(ctx context.Context, tx TTx, id, paymentID int64) error
}
