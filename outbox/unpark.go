package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver"
)

// DefaultUnparkBatch is the rows one statement of Unpark changes when
// UnparkOptions.BatchSize is 0.
const DefaultUnparkBatch = 1000

// UnparkOptions selects the parked events that Unpark makes eligible for
// publishing again. Set EventIDs, Keys, or both (an event must then match
// both), or All alone: Unpark refuses to guess, so that an empty selection
// (a variable left unset) does not unpark every parked event.
type UnparkOptions struct {
	// EventIDs, when not empty, limits the unpark to these events (the
	// event_id of the relay's "event parked as poison" log line, of
	// RelayConfig.OnPark's envelope). They are unparked whenever they were
	// parked.
	EventIDs []uuid.UUID
	// Keys, when not empty, limits the unpark to the events of these keys
	// (aggregate IDs).
	Keys []string
	// All unparks every parked event; it excludes EventIDs and Keys.
	All bool
	// BatchSize is the most rows one statement changes; 0 means
	// DefaultUnparkBatch.
	BatchSize int
}

// Unpark makes parked events eligible for publishing again and returns how
// many it changed: their parked state, attempts and backoff are cleared,
// so a running relay publishes them at its next round (within
// RelayConfig.PollInterval), each followed by the later events of its key
// that it held back, in per-key order. Their last error is kept until
// their next attempt. Fix the cause of the park first (see RelayConfig.OnPark): a
// publisher that still refuses an event with ErrPoison parks it again.
//
// It replaces the SQL of the package doc ("Failures, backoff and poison
// events"), with the same effect. Only events parked now are changed:
// an event that is pending, backing off or published, or an unknown
// event ID, is left as it is and not counted; running Unpark twice is
// harmless. With Keys or All, an event parked after Unpark started is
// not unparked (it may have been parked for a cause not fixed yet, and
// the loop ends even while relays park). "After" is read on the relays'
// clocks (RelayConfig.Now), which stamp the parks, not the caller's:
// Unpark starts by reading the latest park time of the events parked
// now. (A bound from the caller's clock left the latest parks parked
// when that clock was behind the relays'.) Changes are made in batches
// of BatchSize rows, key by key and each key's in ID order, each in a
// statement of its own that reads about the rows it changes.
func Unpark[TTx any](ctx context.Context, drv driver.OutboxDriver[TTx], opts UnparkOptions) (int, error) {
	switch {
	case drv == nil:
		return 0, errors.New("outbox: unpark: nil driver")
	case opts.BatchSize < 0:
		return 0, fmt.Errorf("outbox: unpark: BatchSize %d must not be negative", opts.BatchSize)
	case opts.All && (len(opts.EventIDs) > 0 || len(opts.Keys) > 0):
		return 0, errors.New("outbox: unpark: All excludes EventIDs and Keys")
	case !opts.All && len(opts.EventIDs) == 0 && len(opts.Keys) == 0:
		return 0, errors.New("outbox: unpark: no events selected (set EventIDs, Keys or All)")
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultUnparkBatch
	}
	ex := drv.Outbox()
	if len(opts.EventIDs) > 0 {
		// One statement per BatchSize distinct IDs: each changes at most
		// as many rows as it names, so one call per chunk is enough.
		ids := driver.SortedUniqueIDs(opts.EventIDs)
		total := 0
		for len(ids) > 0 {
			chunk := ids[:min(len(ids), opts.BatchSize)]
			ids = ids[len(chunk):]
			n, err := ex.OutboxUnpark(ctx, &driver.OutboxUnparkParams{EventIDs: chunk, Keys: opts.Keys, Limit: len(chunk)})
			total += n
			if err != nil {
				return total, fmt.Errorf("outbox: unpark: %w", err)
			}
		}
		return total, nil
	}
	last, ok, err := ex.OutboxLastParked(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: unpark: %w", err)
	}
	if !ok {
		return 0, nil // nothing is parked
	}
	p := &driver.OutboxUnparkParams{
		Keys: opts.Keys,
		// Times are stored to the microsecond: the latest one is in.
		ParkedBefore: last.Add(time.Microsecond),
		Limit:        opts.BatchSize,
	}
	total := 0
	for {
		n, err := ex.OutboxUnpark(ctx, p)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox: unpark: %w", err)
		}
		if n < p.Limit {
			return total, nil
		}
	}
}
