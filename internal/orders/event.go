package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
)

// OrderCreated is the payload of an OrderCreated.v1 event.
type OrderCreated struct {
	OrderID    int64  `json:"order_id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"` // decimal string, AmountScale digits
	Items      []Item `json:"items"`
	CreatedAt  string `json:"created_at"` // TimeFormat
}

// CreatedEvent returns the OrderCreated.v1 envelope of o, keyed by the
// order ID (so one order's events share a partition).
func CreatedEvent(o Order) (event.Envelope, error) {
	return event.New(EventOrderCreated, strconv.FormatInt(o.ID, 10), OrderCreated{
		OrderID:    o.ID,
		CustomerID: o.CustomerID,
		Amount:     o.Amount.StringFixed(AmountScale),
		Items:      o.Items,
		CreatedAt:  FormatTime(o.CreatedAt),
	})
}

// Projection returns the consumer handler of the customer summary: it
// applies OrderCreated.v1 events through tx and ignores (applies as a
// no-op) every other type, so new event types never stall the partition.
// A payload it cannot read is poison: dead-lettered at once.
func Projection[TTx any](store Store[TTx]) func(ctx context.Context, tx TTx, e event.Envelope) error {
	return func(ctx context.Context, tx TTx, e event.Envelope) error {
		if e.Type != EventOrderCreated {
			return nil
		}
		oc, _, err := decodeCreated(e)
		if err != nil {
			return err
		}
		return store.ApplyCreated(ctx, tx, oc)
	}
}

// decodeCreated reads the payload of an OrderCreated.v1 event; an
// unreadable one is poison (ErrPoison).
func decodeCreated(e event.Envelope) (OrderCreated, decimal.Decimal, error) {
	var oc OrderCreated
	if err := json.Unmarshal(e.Payload, &oc); err != nil {
		return oc, decimal.Decimal{}, fmt.Errorf("%w: %s %s: %w", idemkafka.ErrPoison, e.Type, e.ID, err)
	}
	amount, err := decimal.NewFromString(oc.Amount)
	if err != nil || oc.OrderID <= 0 || oc.CustomerID <= 0 || !amount.IsPositive() {
		return oc, decimal.Decimal{}, fmt.Errorf("%w: %s %s: bad payload %s", idemkafka.ErrPoison, e.Type, e.ID, e.Payload)
	}
	return oc, amount, nil
}

// TimeFormat is the format of times in responses and events: RFC 3339 in
// UTC with microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// FormatTime formats t with TimeFormat, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }
