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

// EventOrderCreated is the type of the event enqueued with every new order.
const EventOrderCreated = "OrderCreated.v1"

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

// Summary is a customer's row of the projection.
type Summary struct {
	CustomerID  int64
	Orders      int64
	TotalAmount decimal.Decimal
	LastOrderID int64
	UpdatedAt   time.Time
}

// Store stores orders and the projection. TTx is the transaction type of
// the database's idem driver.
type Store[TTx any] interface {
	// Create inserts an order with StatusCreated through tx.
	Create(ctx context.Context, tx TTx, o NewOrder) (Order, error)
	// Get reads an order, or returns ErrNotFound.
	Get(ctx context.Context, id int64) (Order, error)
	// ApplyCreated adds an order to its customer's summary through tx
	// (an upsert). It is not idempotent by itself: the inbox calls it once
	// per event.
	ApplyCreated(ctx context.Context, tx TTx, e OrderCreated) error
	// Summary reads a customer's summary, or returns ErrNotFound.
	Summary(ctx context.Context, customerID int64) (Summary, error)
	// SetStatus sets the status of order id through tx, or returns
	// ErrNotFound. Setting the status it has is a no-op: it is idempotent.
	SetStatus(ctx context.Context, tx TTx, id int64, status string) error
	// SetPayment records through tx the payment charged for order id, or
	// returns ErrNotFound. It is idempotent.
	SetPayment(ctx context.Context, tx TTx, id, paymentID int64) error
}
