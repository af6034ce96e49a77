package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/event"
)

// Publisher sends a batch of events to the broker. The Kafka publisher lives
// in the Kafka package; tests use an in-memory one.
//
// Publish must:
//
//   - publish every envelope as it is, with its ID: a republished event must
//     be recognisable as the same event by the consumer's inbox;
//   - keep the order of events with the same Key (the relay hands them over
//     in outbox order): when an event fails, no later event of its key may
//     be published (kgo fails every record buffered after a failed one in
//     the same partition, which gives exactly this);
//   - report an event as published only once the broker durably accepted
//     it (for Kafka: acknowledged with acks=all by an idempotent producer);
//   - return promptly when ctx is done, as far as the broker client allows.
//
// It returns nil when every event is published. Otherwise it should return
// a *PublishError saying which events are published and why the others are
// not, so that the relay marks exactly those and retries only the rest; any
// other error means that no event is known to be published. Wrap ErrPoison
// into the error of an event that can never be published (a record too
// large, an invalid record, an invalid topic name) to park it at once: in that
// event's entry of a PublishError when the batch has several events (a plain
// error wrapping ErrPoison then parks nothing, as it does not say which event
// is poison; for a batch of one it parks that event). Do not wrap it into
// a failure an operator can end (a topic denied by an ACL, or not created
// yet): parking it would stop the event's key until someone redrives it,
// while a retry publishes it once the cause is gone. The error text is
// stored with the event (made valid UTF-8 without NUL bytes, cut to 4 KiB).
//
// A publisher that may learn an event's outcome after Publish returned it
// failed (a broker client that keeps retrying a record it stopped waiting
// for) can also implement LatePublisher, which the relay then uses.
type Publisher interface {
	Publish(ctx context.Context, events []event.Envelope) error
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, events []event.Envelope) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, events []event.Envelope) error {
	return f(ctx, events)
}

var (
	// ErrPoison marks the error of an event that retrying cannot publish.
	// The relay parks such an event at its first failure, whatever
	// RelayConfig.MaxAttempts says. It is event.ErrPoison (the same value as
	// idemkafka.ErrPoison).
	ErrPoison = event.ErrPoison
	// ErrSkipped marks an event the publisher did not try because it gave
	// up at an earlier one. The relay retries it at its next round without
	// counting a failed attempt. A publisher may skip a whole batch (a
	// circuit breaker open, a rate limit): that round counts as failed, and
	// Run backs off before the next (RelayConfig.Backoff), as after a
	// failed publish.
	ErrSkipped = errors.New("outbox: event skipped after an earlier failure")
)

// PublishError reports a batch published in part.
type PublishError struct {
	// Errs has one entry per event given to Publish, in the same order: nil
	// for an event that is published, the reason for one that is not. An
	// event whose entry wraps ErrSkipped was not tried; one whose entry
	// wraps ErrPoison is parked.
	Errs []error
}

// PrefixError returns the PublishError of a publisher that publishes events
// in order and stops at the first failure: the first index of n events are
// published, event index failed with err, and the rest were skipped.
func PrefixError(n, index int, err error) *PublishError {
	errs := make([]error, n)
	index = max(index, 0)
	for i := index; i < n; i++ {
		if i == index {
			errs[i] = err
		} else {
			errs[i] = fmt.Errorf("%w: %w", ErrSkipped, err)
		}
	}
	return &PublishError{Errs: errs}
}

func (e *PublishError) Error() string {
	failed, first := 0, -1
	for i, err := range e.Errs {
		if err != nil && !errors.Is(err, ErrSkipped) {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		for i, err := range e.Errs {
			if err != nil {
				return fmt.Sprintf("outbox: publish: event %d of %d: %v", i, len(e.Errs), err)
			}
		}
		return fmt.Sprintf("outbox: publish: %d events, no error reported", len(e.Errs))
	}
	return fmt.Sprintf("outbox: publish: %d of %d events failed, first event %d: %v", failed, len(e.Errs), first, e.Errs[first])
}

// Unwrap returns the events' errors, so errors.Is(err, ErrPoison) and the
// like look through the whole batch.
func (e *PublishError) Unwrap() []error { return e.Errs }

// outcomes returns, for each of n events, nil if err reports it published,
// or why not. A nil err publishes all; an error that is not a PublishError
// (or one of the wrong length) fails the first event and skips the rest;
// such an error parks the first event only if it is the only one.
func outcomes(err error, n int) []error {
	out := make([]error, n)
	if err == nil {
		return out
	}
	var pe *PublishError
	if errors.As(err, &pe) && len(pe.Errs) == n {
		copy(out, pe.Errs)
		return out
	}
	switch {
	case errors.As(err, &pe):
		// %v, not %w: the errors of other events (a poison one) must not
		// be taken for the first event's.
		err = fmt.Errorf("%v (PublishError with %d results for %d events: nothing is known published)", err, len(pe.Errs), n) //nolint:errorlint // see above
	case n > 1 && errors.Is(err, ErrPoison):
		// A plain error does not say which event is poison: the first
		// (maybe an innocent event of another key) is retried, not parked.
		err = fmt.Errorf("%v (a poison error without a PublishError for %d events: nothing is known published, nothing parked)", err, n) //nolint:errorlint // see above
	}
	return PrefixError(n, 0, err).Errs
}
