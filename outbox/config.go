package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/observe"
)

// RelayConfig configures a Relay. The zero value (or nil) gives the
// defaults.
type RelayConfig struct {
	// BatchSize is the most events claimed and published at once. Defaults
	// to 500.
	BatchSize int

	// BatchBytes bounds the payload bytes of a batch: a claim stops
	// taking events before the one that would bring the sum of their
	// payloads over it (the rest wait for the next batch, in order), but
	// always takes at least one, so an event larger than BatchBytes goes
	// out alone. A relay's payloads then take a small multiple of
	// Concurrency x BatchBytes (the claimed rows, the envelopes, the
	// publisher's records: 95 MiB of heap at the defaults, draining
	// 512 KiB events), whatever BatchSize and however large the backlog;
	// without it, 500 events of 1 MiB are 500 MiB per batch. Defaults to
	// 16 MiB (DefaultBatchBytes), which small events never reach.
	BatchBytes int

	// Concurrency is how many batches Run keeps in flight at once on a
	// backend with concurrent writers (PostgreSQL): each claims its own
	// lanes of the outbox, so that one batch is published while another is
	// read or marked. Events of one key are always in one lane, so this
	// never reorders a key. Each batch in flight holds a database
	// connection while it is published: size the pool for it. Defaults to
	// 2; ignored on SQLite (one batch at a time).
	Concurrency int

	// PollInterval is how long Run waits for new events after a round that
	// found no event, unless Wake fires first or a failed
	// event becomes due earlier. It is the fallback that bounds the delay of
	// an event when no wake-up arrives. Defaults to 1s.
	PollInterval time.Duration

	// Wake, if set, makes Run look for events at once whenever it receives
	// a value (for example pgdriver.Driver.ListenOutbox, fed by PostgreSQL
	// NOTIFY on every commit that enqueued events). When it is nil and the
	// driver is a Notifier (pgdriver and pgsqldriver are), Run listens itself for as long
	// as it runs; otherwise it polls. After a database failure a wake-up
	// ends the backoff early (the database is back); after a publish
	// failure it does not. Closing Wake ends its wake-ups: Run logs a
	// warning and polls.
	Wake <-chan struct{}
	// NoListen keeps Run from listening on the driver's Notifier when Wake
	// is nil: polling only.
	NoListen bool

	// Backoff returns how long to wait before the next attempt after the
	// attempt-th consecutive failure (attempt >= 1). It spaces the retries
	// of a failed event, and of a whole round when the database or the
	// publisher fails. Defaults to DefaultBackoff: 100ms doubling up to 1m.
	// A failed round waits a random duration between half of it and all of
	// it, so relays that failed together do not retry together; at least
	// 10ms (a Backoff of 0 retries a failed event at once, but never makes
	// a failing relay spin).
	Backoff func(attempt int) time.Duration

	// MaxAttempts is how many failed attempts make an event poison: it is
	// then parked (kept, never retried, blocking only the later events of
	// its key), logged as an error and reported to OnPark. Defaults to 0:
	// retry forever.
	MaxAttempts int

	// PublishTimeout is the deadline of the context given to Publish. On
	// PostgreSQL the claiming transaction, with its lanes' locks, stays open
	// while Publish runs, so a hung broker must not hold it forever. A
	// broker client may outlive its context (kgo's idempotent producer
	// does, for records whose outcome is unsure, rather than risk a
	// duplicate; idemkafka.Publisher returns StragglerTimeout after it
	// instead, and sooner when only some partitions do not answer, and
	// tells the outcome later, see LatePublisher), and
	// the connection to the database may be lost while
	// publishing: so the claim also sets the transaction's
	// idle_in_transaction_session_timeout to PublishTimeout + 20s (whatever
	// the server's setting). A relay stalled that long has its session ended
	// by the server and its lanes freed; other relays then publish its
	// events again, with the same IDs and in order (at least once: the
	// consumers' inboxes drop the copies). Defaults to 30s.
	PublishTimeout time.Duration

	// Lease is, on a backend without concurrent writers (SQLite), how long
	// the lease that lets one relay of a database publish (RelayLockName,
	// table idem_lock) lives without renewal. Run renews it every Lease/3
	// (a failed renewal is retried after 100ms, doubling up to Lease/3);
	// a relay that died without releasing it is taken over by a standby
	// relay within Lease (plus one poll). Defaults to DefaultRelayLease.
	// At least 100ms. Ignored on PostgreSQL, whose relays share the lanes
	// instead.
	Lease time.Duration

	// OnPublished, if set, is called after each batch whose marks
	// committed, with the events published (for metrics). It must not
	// block.
	OnPublished func(events []event.Envelope)
	// OnLag, if set, is called after each round with the age of the oldest
	// unpublished event (0 when there is none), parked ones included (for a
	// lag gauge and its alert); at most every 250ms by Run. On SQLite a
	// relay standing by reports it too, each time it tries the lease. Run
	// also reports it every PollInterval in which nothing else did, so that
	// a round that does not end (a Publish outliving its context while the
	// broker does not answer) does not freeze the gauge.
	OnLag func(lag time.Duration)
	// OnPark, if set, is called when an event is parked as poison after
	// attempts failed attempts, the last one with err.
	OnPark func(e event.Envelope, attempts int, err error)
	// OnLease, if set, is called by Run with whether this relay publishes
	// (true) or stands by (false): once when Run starts, with the initial
	// state, then on each change, never per batch (for an "active relay"
	// gauge). On SQLite it is true while the relay holds the relay lease
	// (RelayLockName), false while another relay holds it or the lease
	// cannot be reached, and false again when Run returns after holding
	// it. On PostgreSQL (and on a driver without a lock table) relays
	// share the work and never stand by: it is called with true when Run
	// starts and with false when Run returns. RunOnce does not call it.
	// It must not block.
	OnLease func(held bool)

	// Tracer, if set, traces every round that claimed events with an
	// idem.outbox.relay.batch span (attributes idem.events, idem.published,
	// idem.failed), which continues or links the trace context stored with
	// the events (see package observe). Publish gets the span's context.
	// Nil (the default) traces nothing.
	Tracer observe.Tracer

	// Logger receives warnings (failed attempts) and errors (parked
	// events, storage failures). A publish failure that repeats (same
	// error text, digits aside) is logged when first seen, then at most
	// every 30s with the number of rounds not logged, and at INFO when an
	// event that failed with it is published again; so are the rounds of
	// Run that fail in the database and the lag queries that fail, with an
	// INFO line when the database answers again (see the package doc).
	// The lines about a round's events (parked, failed, published again,
	// skipped, out of order) are logged in the context of its
	// idem.outbox.relay.batch span (slog's Context variants), so that a
	// handler can add the span's IDs. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// DefaultBatchBytes is the default RelayConfig.BatchBytes: 16 MiB.
const DefaultBatchBytes = 16 << 20

// minBackoff floors the wait of a relay after a failed round: a Backoff of
// 0 must not make it retry a failing broker in a tight loop.
const minBackoff = 10 * time.Millisecond

// DefaultBackoff is the default RelayConfig.Backoff: 100ms after the first
// failure, doubling with each further one, at most 1 minute.
func DefaultBackoff(attempt int) time.Duration {
	return backoff.Exp(attempt, 100*time.Millisecond, time.Minute)
}

func (c RelayConfig) withDefaults(concurrentWriters bool) RelayConfig {
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	switch {
	case !concurrentWriters:
		c.Concurrency = 1
	case c.Concurrency == 0:
		c.Concurrency = 2
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.Lease == 0 {
		c.Lease = DefaultRelayLease
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c RelayConfig) validate() error {
	var errs []error
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("BatchSize %d must not be negative", c.BatchSize))
	}
	if c.BatchBytes < 0 {
		errs = append(errs, fmt.Errorf("BatchBytes %d must not be negative", c.BatchBytes))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("negative Concurrency %d", c.Concurrency))
	}
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval %s must not be negative", c.PollInterval))
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d must not be negative", c.MaxAttempts))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("PublishTimeout %s must not be negative", c.PublishTimeout))
	}
	if c.Lease != 0 && c.Lease < minLease {
		errs = append(errs, fmt.Errorf("a Lease of %s is under the minimum of %s", c.Lease, minLease))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: invalid RelayConfig: %w", err)
	}
	return nil
}
