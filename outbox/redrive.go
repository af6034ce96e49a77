package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
)

// DefaultRedriveBatch is the rows one statement of Redrive changes when
// RedriveOptions.BatchSize is 0.
const DefaultRedriveBatch = 1000

// RedriveOptions selects the published events that Redrive publishes again.
type RedriveOptions struct {
	// Since is the earliest publication time redriven ("the last two
	// hours": time.Now().Add(-2*time.Hour)). Zero redrives every
	// published row still in the outbox (retention removes them after
	// cleanup.Config's outbox TTL). Publication times are the relays'
	// clocks (RelayConfig.Now): when the caller's clock may be ahead of
	// theirs, widen the window by as much.
	Since time.Time
	// Before, when set, is the latest publication time redriven
	// (exclusive), on the relays' clocks like Since: the rows published at
	// or after it are left alone. Zero redrives every row published before
	// Redrive started. A caller that redrives periodically from several
	// processes (idemd's stuck-order watchdog, on every replica) sets it
	// some time back, so that the rows another process redrove and a
	// relay published again since are not redriven once more.
	Before time.Time
	// Keys, when not empty, limits the redrive to the events of these keys
	// (aggregate IDs).
	Keys []string
	// BatchSize is the most rows one statement changes; 0 means
	// DefaultRedriveBatch.
	BatchSize int
}

// Redrive makes published events unpublished again so that the relay
// publishes them once more, with their original event IDs, and returns how
// many it changed. It is the safety net for a broker that lost events it had
// acknowledged: a fresh log of an embedded broker, a deleted and recreated
// topic, a cluster that failed over to a replica that lagged. Consumers that
// deduplicate with an inbox (package inbox) drop the copies of events they
// had already applied, so redriving too much costs only traffic; redriving
// too little loses events, so when in doubt, redrive a wider window.
//
// Only rows published before Redrive started are changed, in batches of
// BatchSize, the earliest published first, so it ends even while relays
// run and republish what it released. "Before" is read on the relays'
// clocks, not the caller's: Redrive starts by reading the latest
// publication time recorded, and changes nothing published after it. (A
// bound from the caller's clock missed the latest publications when that
// clock was behind the relays', and redrove the relays' republications
// again, until it caught up, when it was ahead.) Each batch reads about
// the rows it changes, however many there are.
//
// Per-key order: the redriven rows of a key are published in ID order
// (they were published in that order, and are redriven in the order of
// their publication times, unless relays whose clocks disagree by more
// than the time between two publications of the key published them), but
// if a key also has unpublished rows that a relay is publishing at that
// moment, a redriven (older) event can reach consumers after a newer one;
// consumers of redriven events must therefore tolerate seeing an old event
// late (the inbox drops it if it was applied; a handler that was never
// given it applies it then). Parked rows are not touched. Run one Redrive
// at a time: two running at once release their batches independently, and
// a key's redriven rows can then be published out of ID order.
func Redrive[TTx any](ctx context.Context, drv driver.OutboxDriver[TTx], opts RedriveOptions) (int, error) {
	if drv == nil {
		return 0, errors.New("outbox: redrive: nil driver")
	}
	if opts.BatchSize < 0 {
		return 0, fmt.Errorf("outbox: redrive: BatchSize %d must not be negative", opts.BatchSize)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultRedriveBatch
	}
	ex := drv.Outbox()
	last, ok, err := ex.OutboxLastPublished(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: redrive: %w", err)
	}
	if !ok {
		return 0, nil // nothing published is kept
	}
	p := &driver.OutboxRedriveParams{
		PublishedSince: opts.Since,
		// Times are stored to the microsecond: the latest one is in.
		PublishedBefore: last.Add(time.Microsecond),
		Keys:            opts.Keys,
		Limit:           opts.BatchSize,
	}
	if !opts.Before.IsZero() && opts.Before.Before(p.PublishedBefore) {
		p.PublishedBefore = opts.Before
	}
	total := 0
	for {
		n, err := ex.OutboxRedrive(ctx, p)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox: redrive: %w", err)
		}
		if n < p.Limit {
			return total, nil
		}
	}
}
