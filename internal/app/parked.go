package app

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// parkedInterval is how often idemd counts the events parked in the outbox
// (idemd_outbox_parked_events): one count through an index of the events
// that failed, never on a scrape. A park by this replica's relay counts
// again at once.
const parkedInterval = 10 * time.Second

// parkedChecker keeps idemd_outbox_parked_events: the events parked in the
// outbox now, the whole database's. A failed count keeps the last value
// and is logged when it starts, at most every lagLogInterval while it
// lasts, and once when a count succeeds again.
type parkedChecker struct {
	count    func(context.Context) (int, error)
	m        *metrics
	log      *slog.Logger
	interval time.Duration
	// wake counts again now (a relay of this replica parked an event).
	wake chan struct{}

	// fails logs the failed counts (set up by the first check).
	fails failureLog
}

// parked wakes the checker; it never blocks.
func (c *parkedChecker) parked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run counts now, then every interval and on each wake-up until ctx ends.
func (c *parkedChecker) run(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		c.check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.wake:
		}
	}
}

// check counts once.
func (c *parkedChecker) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.interval)
	defer cancel()
	n, err := c.count(ctx)
	if err != nil && errors.Is(context.Cause(ctx), context.Canceled) {
		return // the shutdown: no failure to log
	}
	if err == nil {
		c.m.parkedNow.Set(float64(n))
	}
	if c.fails.log == nil {
		c.fails = failureLog{
			log:          c.log,
			recovered:    "outbox: parked events counted again after failed counts",
			failed:       "outbox: parked events unknown; idemd_outbox_parked_events keeps its last value",
			stillFailing: "outbox: parked events still unknown",
			countKey:     "failed_counts",
		}
	}
	c.fails.observe(err)
}
