package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
)

// EnqueueTx stores events in the outbox inside the caller's transaction tx.
// They become visible to the relay when tx commits, and vanish if it rolls
// back. EnqueueTx never commits.
//
// Every envelope is validated first (event.Envelope.Validate); one invalid
// envelope stores none of them. Events are stored in the order given, which
// is the order in which the events of one key are published. Across
// transactions, the events of a key are published in the order of their
// rows' IDs only if those transactions are serialised on the key (enqueue
// after the write that locks the aggregate); see the package documentation.
// An envelope whose ID is already in the outbox (a retry of the same
// operation) is skipped: the first stored version of an ID is the one
// published.
func EnqueueTx[TTx any](ctx context.Context, drv driver.OutboxDriver[TTx], tx TTx, events ...event.Envelope) error {
	if len(events) == 0 {
		return nil
	}
	now := time.Now()
	rows := make([]driver.OutboxRow, len(events))
	for i, e := range events {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("outbox: enqueue event %d of %d: %w", i+1, len(events), err)
		}
		row, err := toRow(e, now)
		if err != nil {
			return fmt.Errorf("outbox: enqueue event %s: %w", e.ID, err)
		}
		rows[i] = row
	}
	if _, err := drv.OutboxTx(tx).OutboxInsert(ctx, rows); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	return nil
}

// toRow converts an envelope to the stored row.
func toRow(e event.Envelope, now time.Time) (driver.OutboxRow, error) {
	r := driver.OutboxRow{
		EventID:    e.ID,
		EventType:  e.Type,
		Key:        e.Key,
		SagaID:     e.SagaID,
		OccurredAt: e.OccurredAt,
		Payload:    e.Payload,
		CreatedAt:  now,
	}
	if len(e.Headers) > 0 {
		h, err := json.Marshal(e.Headers)
		if err != nil {
			return r, fmt.Errorf("encode headers: %w", err)
		}
		r.Headers = h
	}
	return r, nil
}

// toEnvelope converts a stored row back to the envelope that was enqueued.
func toEnvelope(r driver.OutboxRow) (event.Envelope, error) {
	e := event.Envelope{
		ID:         r.EventID,
		Type:       r.EventType,
		Key:        r.Key,
		SagaID:     r.SagaID,
		OccurredAt: r.OccurredAt.UTC(),
		Payload:    r.Payload,
	}
	if len(r.Headers) > 0 {
		if err := json.Unmarshal(r.Headers, &e.Headers); err != nil {
			return e, fmt.Errorf("decode stored headers of event %s: %w", r.EventID, err)
		}
	}
	return e, nil
}
