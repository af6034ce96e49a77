package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/txnil"
	"github.com/idemkit/idem/observe"
)

// EnqueueTx stores events in the outbox inside the caller's transaction tx.
// They become visible to the relay when tx commits, and vanish if it rolls
// back. EnqueueTx never commits.
//
// Every envelope is validated first (event.Envelope.ValidateStorable); one invalid
// envelope stores none of them. Events are stored in the order given, which
// is the order in which the events of one key are published. Across
// transactions, the events of a key are published in the order of their
// rows' IDs only if those transactions are serialised on the key (enqueue
// after the write that locks the aggregate); see the package documentation.
// An envelope whose ID is already in the outbox (a retry of the same
// operation) is skipped: the first stored version of an ID is the one
// published.
//
// Tracing: with a default observe.Tracer (observe.SetDefault, which
// idemotel.Install calls) EnqueueTx runs in an idem.outbox.enqueue span.
// With a default observe.Propagator it stores the trace context of ctx
// (traceparent, tracestate) in the Headers of every event that has no
// traceparent header yet; the relay publishes them as Kafka record headers,
// and the consumer's inbox continues the trace. The caller's Headers maps
// are not modified.
func EnqueueTx[TTx any](ctx context.Context, drv driver.OutboxDriver[TTx], tx TTx, events ...event.Envelope) (err error) {
	if txnil.Is(tx) {
		return errNilTx
	}
	if len(events) == 0 {
		return nil
	}
	if t := observe.DefaultTracer(); t != nil {
		var span observe.Span
		ctx, span = observe.StartKind(ctx, t, observe.KindProducer, "idem.outbox.enqueue", observe.Int("idem.events", len(events)))
		defer func() {
			// A panic (of the driver) ends the span failed, and goes on.
			if p := recover(); p != nil {
				observe.End(span, fmt.Errorf("panic: %v", p))
				panic(p)
			}
			observe.End(span, err)
		}()
	}
	trace := traceHeaders(ctx)
	now := time.Now()
	rows := make([]driver.OutboxRow, len(events))
	for i, e := range events {
		if err := e.ValidateStorable(); err != nil {
			return fmt.Errorf("outbox: enqueue event %d of %d: %w", i+1, len(events), err)
		}
		if len(trace) > 0 {
			e.Headers = withTrace(e.Headers, trace)
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

// errNilTx is EnqueueTx's error for a nil transaction.
var errNilTx = errors.New("outbox: enqueue: nil transaction (EnqueueTx writes in the caller's transaction: pass the one of the business write)")

// traceHeaders returns the trace-context headers of ctx from the default
// propagator (nil without one, or when ctx has no trace context).
func traceHeaders(ctx context.Context) map[string]string {
	p := observe.DefaultPropagator()
	if p == nil {
		return nil
	}
	var h map[string]string
	p.Inject(ctx, func(k, v string) {
		if h == nil {
			h = make(map[string]string, 2)
		}
		h[k] = v
	})
	return h
}

// withTrace returns a copy of headers with the trace headers added, or
// headers itself when they already carry a traceparent (the caller's
// choice wins).
func withTrace(headers, trace map[string]string) map[string]string {
	if _, ok := headers[observe.TraceParent]; ok {
		return headers
	}
	out := make(map[string]string, len(headers)+len(trace))
	maps.Copy(out, headers)
	maps.Copy(out, trace)
	return out
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
