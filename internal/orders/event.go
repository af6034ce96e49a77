package orders

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/idemkit/idem/event"
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

// OrderOutcome is the payload of the OrderConfirmed.v1 and
// OrderRejected.v1 events.
type OrderOutcome struct {
	OrderID    int64  `json:"order_id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"` // decimal string, AmountScale digits
}

// OutcomeEvent returns the envelope of type typ (EventOrderConfirmed or
// EventOrderRejected) of o, keyed by the order ID like OrderCreated.v1.
// Its ID is random: the saga replaces it with a derived one (saga.Coordinator.EmitTx).
func OutcomeEvent(typ string, o Order) (event.Envelope, error) {
	return event.New(typ, strconv.FormatInt(o.ID, 10), OrderOutcome{
		OrderID:    o.ID,
		CustomerID: o.CustomerID,
		Amount:     o.Amount.StringFixed(AmountScale),
	})
}

// Projection returns the per-event consumer handler of the customer
// summary: ProjectionBatch with one event.
func Projection[TTx any](store Store[TTx]) func(ctx context.Context, tx TTx, e event.Envelope) error {
	batch := ProjectionBatch(store)
	return func(ctx context.Context, tx TTx, e event.Envelope) error {
		return batch(ctx, tx, []event.Envelope{e})
	}
}

// ProjectionBatch returns the batch consumer handler of the customer
// summary (idemkafka.ConsumerConfig.BatchHandler): it adds up the events
// into one SummaryDelta per customer (Deltas) and applies them through tx
// with Store.Apply, in ascending customer ID order, so two transactions
// (two replicas' partition batches) lock the same summary rows in the
// same order and never deadlock. Event types other than OrderCreated.v1,
// OrderConfirmed.v1 and OrderRejected.v1 are ignored (applied as no-ops),
// so new event types never stall the partition; another version of those
// three (an OrderCreated.v2 from a newer producer) is poison, like a
// payload it cannot read: dead-lettered at once (after the consumer's
// one-at-a-time retry of the batch), never skipped.
func ProjectionBatch[TTx any](store Store[TTx]) func(ctx context.Context, tx TTx, events []event.Envelope) error {
	return func(ctx context.Context, tx TTx, events []event.Envelope) error {
		deltas, err := Deltas(events)
		if err != nil || len(deltas) == 0 {
			return err
		}
		return store.Apply(ctx, tx, deltas)
	}
}

// Deltas adds up what events contribute to the summaries, one delta per
// customer, sorted by customer ID:
//
//	OrderCreated.v1   -> orders + 1
//	OrderConfirmed.v1 -> confirmed + 1, total_amount + amount
//	OrderRejected.v1  -> rejected + 1
//
// and every one of them last_order_id = greatest(last_order_id, order_id).
// Additions commute, so the summary is the same whatever order an order's
// events arrive in (a republished old event, partitions consumed at
// different speeds). Other event types are skipped; an unreadable payload
// of a known type, and another version of a known type, are poison
// (ErrPoison).
func Deltas(events []event.Envelope) ([]SummaryDelta, error) {
	byCustomer := map[int64]*SummaryDelta{}
	for _, e := range events {
		var (
			orderID, customerID int64
			add                 func(d *SummaryDelta)
		)
		switch e.Type {
		case EventOrderCreated:
			oc, _, err := decodeCreated(e)
			if err != nil {
				return nil, err
			}
			orderID, customerID = oc.OrderID, oc.CustomerID
			add = func(d *SummaryDelta) { d.Orders++ }
		case EventOrderConfirmed, EventOrderRejected:
			oo, amount, err := decodeOutcome(e)
			if err != nil {
				return nil, err
			}
			orderID, customerID = oo.OrderID, oo.CustomerID
			if e.Type == EventOrderConfirmed {
				add = func(d *SummaryDelta) { d.Confirmed++; d.ConfirmedAmount = d.ConfirmedAmount.Add(amount) }
			} else {
				add = func(d *SummaryDelta) { d.Rejected++ }
			}
		default:
			if err := otherVersion(e, EventOrderCreated, EventOrderConfirmed, EventOrderRejected); err != nil {
				return nil, err
			}
			continue
		}
		d := byCustomer[customerID]
		if d == nil {
			d = &SummaryDelta{CustomerID: customerID}
			byCustomer[customerID] = d
		}
		add(d)
		d.LastOrderID = max(d.LastOrderID, orderID)
	}
	out := make([]SummaryDelta, 0, len(byCustomer))
	for _, d := range byCustomer {
		out = append(out, *d)
	}
	SortDeltas(out)
	return out, nil
}

// otherVersion returns an ErrPoison error when e's type has the name of
// one of known (the types a consumer acts on) in another version: an
// OrderCreated.v2 that a newer producer emits while this consumer knows
// only OrderCreated.v1 (a rolling deploy that upgraded the producers
// first). Applied as a no-op, the inbox would record it and the upgraded
// consumer would never see it; dead-lettered, it is logged and counted,
// and redriven once the consumers know it (docs/operations.md, "Dead
// letters"). Types with other names are not the consumer's: nil.
func otherVersion(e event.Envelope, known ...string) error {
	name := typeName(e.Type)
	for _, k := range known {
		if typeName(k) == name {
			return fmt.Errorf("%w: %s %s: unknown version of %s (this consumer knows %s): deploy the consumers that know it, then redrive it",
				event.ErrPoison, e.Type, e.ID, name, k)
		}
	}
	return nil
}

// typeName returns typ without its ".vN" version suffix (event.TypePattern).
func typeName(typ string) string {
	if i := strings.LastIndex(typ, ".v"); i >= 0 {
		return typ[:i]
	}
	return typ
}

// SortDeltas sorts deltas by ascending customer ID, the order in which the
// stores lock the summary rows.
func SortDeltas(deltas []SummaryDelta) {
	slices.SortFunc(deltas, func(a, b SummaryDelta) int { return cmp.Compare(a.CustomerID, b.CustomerID) })
}

// decodeCreated reads the payload of an OrderCreated.v1 event; an
// unreadable one is poison (ErrPoison).
func decodeCreated(e event.Envelope) (OrderCreated, decimal.Decimal, error) {
	var oc OrderCreated
	if err := json.Unmarshal(e.Payload, &oc); err != nil {
		return oc, decimal.Decimal{}, fmt.Errorf("%w: %s %s: %w", event.ErrPoison, e.Type, e.ID, err)
	}
	amount, err := decimal.NewFromString(oc.Amount)
	if err != nil || oc.OrderID <= 0 || oc.CustomerID <= 0 || !amount.IsPositive() {
		return oc, decimal.Decimal{}, fmt.Errorf("%w: %s %s: bad payload %s", event.ErrPoison, e.Type, e.ID, e.Payload)
	}
	return oc, amount, nil
}

// decodeOutcome reads the payload of an OrderConfirmed.v1 or
// OrderRejected.v1 event; an unreadable one is poison (ErrPoison).
func decodeOutcome(e event.Envelope) (OrderOutcome, decimal.Decimal, error) {
	var oo OrderOutcome
	if err := json.Unmarshal(e.Payload, &oo); err != nil {
		return oo, decimal.Decimal{}, fmt.Errorf("%w: %s %s: %w", event.ErrPoison, e.Type, e.ID, err)
	}
	amount, err := decimal.NewFromString(oo.Amount)
	if err != nil || oo.OrderID <= 0 || oo.CustomerID <= 0 || !amount.IsPositive() {
		return oo, decimal.Decimal{}, fmt.Errorf("%w: %s %s: bad payload %s", event.ErrPoison, e.Type, e.ID, e.Payload)
	}
	return oo, amount, nil
}

// TimeFormat is the format of times in responses and events: RFC 3339 in
// UTC with microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// FormatTime formats t with TimeFormat, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }
