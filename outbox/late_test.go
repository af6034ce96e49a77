package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

var errUnknown = errors.New("not acknowledged in time; outcome unknown")

// latePublisher is an outbox.LatePublisher: each PublishLate call goes to
// fn with the call's number (from 1); it records every event it is given.
type latePublisher struct {
	mu    sync.Mutex
	calls int
	seen  []uuid.UUID
	fn    func(call int, events []event.Envelope, late func(int, error)) error
}

func (p *latePublisher) Publish(ctx context.Context, events []event.Envelope) error {
	return p.PublishLate(ctx, events, nil)
}

func (p *latePublisher) PublishLate(_ context.Context, events []event.Envelope, late func(int, error)) error {
	p.mu.Lock()
	p.calls++
	n := p.calls
	for _, e := range events {
		p.seen = append(p.seen, e.ID)
	}
	p.mu.Unlock()
	return p.fn(n, events, late)
}

// given returns how many times the publisher was given event id.
func (p *latePublisher) given(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.seen {
		if s == id {
			n++
		}
	}
	return n
}

// marked collects OnPublished's events.
type marked struct {
	mu  sync.Mutex
	ids []uuid.UUID
}

func (m *marked) on(evs []event.Envelope) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range evs {
		m.ids = append(m.ids, e.ID)
	}
}

func (m *marked) has(id uuid.UUID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.ids, id)
}

func allPublished[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) bool {
	t.Helper()
	_, ok, err := drv.Outbox().OutboxOldestUnpublished(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return !ok
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// newLateRelay returns a relay of drv through pub that neither polls nor
// retries on its own within a test (poll and backoff: an hour), changed by
// set (when not nil).
func newLateRelay[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], pub outbox.Publisher, set func(*outbox.RelayConfig)) *outbox.Relay[TTx] {
	t.Helper()
	cfg := &outbox.RelayConfig{
		PollInterval: time.Hour,
		Backoff:      func(int) time.Duration { return time.Hour },
		NoListen:     true,
		Logger:       slog.New(slog.DiscardHandler),
	}
	if set != nil {
		set(cfg)
	}
	relay, err := outbox.NewRelay(drv, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return relay
}

// onEveryBackend runs a check on SQLite, pgdriver and pgsqldriver.
func onEveryBackend(t *testing.T, onSQL func(*testing.T, driver.OutboxDriver[*sql.Tx]), onPgx func(*testing.T, driver.OutboxDriver[pgx.Tx])) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); onSQL(t, testdb.SQLite(t)) })
	t.Run("pgdriver", func(t *testing.T) { t.Parallel(); onPgx(t, testdb.Postgres(t)) })
	t.Run("pgsqldriver", func(t *testing.T) { t.Parallel(); onSQL(t, testdb.PostgresSQL(t)) })
}

// An event whose outcome was unknown when Publish returned, reported
// published later, is marked published and not published again, even
// though its backoff is an hour; the later event of its key, held behind
// it (failed at once, as idemkafka does while the key's record waits), is
// published at once, without waiting for the poll (an hour) either.
func TestLateOutcomePublishedFreesTheKey(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, checkLatePublished[*sql.Tx], checkLatePublished[pgx.Tx])
}

func checkLatePublished[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	d1, e1, other := mustEvent(t, "k"), mustEvent(t, "k"), mustEvent(t, "other")
	var (
		lateOf  = make(chan func(int, error), 1)
		d1Index = make(chan int, 1)
	)
	pub := &latePublisher{fn: func(call int, events []event.Envelope, late func(int, error)) error {
		errs := make([]error, len(events))
		if call > 1 {
			return nil
		}
		for i, e := range events {
			switch e.ID {
			case d1.ID:
				errs[i] = errUnknown
				d1Index <- i
			case e1.ID:
				errs[i] = errUnknown // the key is held: no record, not reported late
			}
		}
		lateOf <- late
		return &outbox.PublishError{Errs: errs}
	}}
	var m marked
	relay := newLateRelay(t, drv, pub, func(c *outbox.RelayConfig) { c.OnPublished = m.on })
	enqueueTx(t, drv, d1, e1, other)
	runInBackground(t, relay)
	late := <-lateOf
	i := <-d1Index
	eventually(t, 5*time.Second, "the other key published", func() bool { return m.has(other.ID) })
	if m.has(d1.ID) || m.has(e1.ID) {
		t.Fatal("events of the held key marked before their outcome")
	}
	late(i, nil)
	// OnPublished runs after the late mark's commit: wait for it too.
	took := eventually(t, 5*time.Second, "every event published, and the late one reported to OnPublished", func() bool {
		return allPublished(t, drv) && m.has(d1.ID)
	})
	t.Logf("the held key drained %s after the late outcome (backoff and poll: 1h)", took)
	if n := pub.given(d1.ID); n != 1 {
		t.Errorf("event published late given to Publish %d times; want once (not published again)", n)
	}
	if n := pub.given(e1.ID); n != 2 {
		t.Errorf("the key's next event given to Publish %d times; want twice (held, then published)", n)
	}
}

// An event reported failed late is retried at once, not after its backoff.
// A late outcome reported before Publish returns waits for the round's
// marks: applied before them, the round's mark of the event failed would
// not find it pending.
func TestLateOutcomeFailedRetriesAtOnce(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, checkLateFailed[*sql.Tx], checkLateFailed[pgx.Tx])
}

func checkLateFailed[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	d1, d2, e1 := mustEvent(t, "k"), mustEvent(t, "k"), mustEvent(t, "j")
	pub := &latePublisher{fn: func(call int, events []event.Envelope, late func(int, error)) error {
		if call > 1 {
			return nil
		}
		errs := make([]error, len(events))
		for i, e := range events {
			errs[i] = errUnknown
			switch e.ID {
			case d1.ID:
				late(i, errors.New("broker: NOT_LEADER_FOR_PARTITION")) // before Publish returns
			case e1.ID:
				late(i, nil) // published after all, before Publish returns
			}
		}
		return &outbox.PublishError{Errs: errs}
	}}
	relay := newLateRelay(t, drv, pub, nil)
	enqueueTx(t, drv, d1, d2, e1)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("first round: no error; want the publish failure")
	}
	// The next round applies the late outcomes first: d1 is due again and
	// e1 is published.
	if n, err := relay.RunOnce(t.Context()); err != nil || n != 2 {
		t.Fatalf("second round: %d published, %v; want d1 and d2 published", n, err)
	}
	if !allPublished(t, drv) {
		t.Fatal("events left unpublished")
	}
	if n := pub.given(e1.ID); n != 1 {
		t.Errorf("event published late given to Publish %d times; want once", n)
	}
}

// A late outcome never marks an event published before an earlier event of
// its key: reported published while the earlier one's outcome is not known,
// it is ignored (the event is published again after its head); once the
// earlier one is reported published too, both are marked, in one go.
func TestLateOutcomeKeepsTheKeyOrder(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, checkLateOrder[*sql.Tx], checkLateOrder[pgx.Tx])
}

func checkLateOrder[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	d1, d2 := mustEvent(t, "k"), mustEvent(t, "k")
	var late func(int, error)
	pub := &latePublisher{fn: func(call int, events []event.Envelope, l func(int, error)) error {
		if call == 1 {
			late = l
			return &outbox.PublishError{Errs: []error{errUnknown, errUnknown}}
		}
		return errUnknown
	}}
	var m marked
	relay := newLateRelay(t, drv, pub, func(c *outbox.RelayConfig) { c.OnPublished = m.on })
	enqueueTx(t, drv, d1, d2)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("first round: no error; want the publish failure")
	}
	late(1, nil) // d2 before d1: ignored
	if n, err := relay.RunOnce(t.Context()); err != nil || n != 0 {
		t.Fatalf("second round: %d published, %v; want nothing claimed (d1 backs off)", n, err)
	}
	if m.has(d2.ID) {
		t.Fatal("d2 marked published while d1, earlier in its key, is pending")
	}
	late(0, nil)
	late(1, nil)
	if _, err := relay.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !m.has(d1.ID) || !m.has(d2.ID) || !allPublished(t, drv) {
		t.Fatal("d1 and d2 reported published in order: not both marked")
	}
	if n := pub.given(d2.ID); n != 1 {
		t.Errorf("d2 given to Publish %d times; want once", n)
	}
}

// A late outcome of a round whose marks did not commit is dropped: the
// round's events are claimed again. Applied, it would mark d2 published
// while d1, published by that round but not marked, is pending: the key's
// order would slip in the outbox.
func TestLateOutcomeOfARolledBackRoundIsDropped(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	d1, d2 := mustEvent(t, "k"), mustEvent(t, "k")
	var late func(int, error)
	pub := &latePublisher{fn: func(call int, events []event.Envelope, l func(int, error)) error {
		if call == 1 {
			late = l
			return &outbox.PublishError{Errs: []error{nil, errUnknown}}
		}
		return nil
	}}
	fd := &flakyMarksDriver{Driver: drv}
	fd.fail.Store(true)
	relay, err := outbox.NewRelay(fd, pub, &outbox.RelayConfig{
		PollInterval: time.Hour,
		Backoff:      func(int) time.Duration { return time.Hour },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, drv, d1, d2)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("first round: no error; want its marks to fail")
	}
	late(1, nil)
	fd.fail.Store(false)
	if n, err := relay.RunOnce(t.Context()); err != nil || n != 2 {
		t.Fatalf("second round: %d published, %v; want d1 and d2 claimed again and published", n, err)
	}
}

// flakyMarksDriver fails the marks of published events while fail is set.
type flakyMarksDriver struct {
	driver.Driver[*sql.Tx]
	fail atomic.Bool
}

func (d *flakyMarksDriver) OutboxTx(tx *sql.Tx) driver.OutboxExecutor {
	if d.fail.Load() {
		return failMarks{d.Driver.OutboxTx(tx)}
	}
	return d.Driver.OutboxTx(tx)
}

// A round whose event was marked published while it published it (by the
// late outcome of an earlier attempt, maybe another relay's) and that
// failed it keeps it published, and its other marks: its mark failed finds
// no pending row (driver.ErrNotFound), which used to fail the round and
// roll its marks back (its events were published again).
func TestRoundKeepsAnEventPublishedMeanwhile(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, checkPublishedMeanwhile[*sql.Tx], checkPublishedMeanwhile[pgx.Tx])
}

func checkPublishedMeanwhile[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	d1, other := mustEvent(t, "k"), mustEvent(t, "other")
	var d1Row atomic.Int64
	pub := &latePublisher{fn: func(call int, events []event.Envelope, _ func(int, error)) error {
		errs := make([]error, len(events))
		for i, e := range events {
			if e.ID != d1.ID {
				continue
			}
			errs[i] = errUnknown
			if call == 2 {
				// Another relay marks it published meanwhile.
				markPublished(t, drv, d1Row.Load())
			}
		}
		return &outbox.PublishError{Errs: errs}
	}}
	var m marked
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff:     func(int) time.Duration { return 0 },
		NoListen:    true,
		OnPublished: m.on,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueueTx(t, drv, d1)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("first round: no error; want the publish failure")
	}
	d1Row.Store(rowIDOf(t, drv, d1.ID))
	enqueueTx(t, drv, other)
	n, err := relay.RunOnce(t.Context())
	if err == nil || n != 1 || !m.has(other.ID) {
		t.Fatalf("second round: %d published, %v; want the other event marked and d1's failure reported", n, err)
	}
	if !allPublished(t, drv) {
		t.Fatal("d1, marked published during the round, is pending again")
	}
}

// rowIDOf returns the row ID of event id, which must be claimable, by a
// claim rolled back.
func rowIDOf[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], id uuid.UUID) int64 {
	t.Helper()
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Rollback(ctx, tx) }()
	rows, err := drv.OutboxTx(tx).OutboxClaimBatch(ctx, &driver.OutboxClaimBatchParams{Now: time.Now().Add(time.Hour), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.EventID == id {
			return r.ID
		}
	}
	t.Fatalf("event %s not claimable", id)
	return 0
}

// markPublished marks row id published in a transaction of its own, as a
// relay applying a late outcome does.
func markPublished[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], id int64) {
	t.Helper()
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = drv.Rollback(ctx, tx) }()
	if err := drv.OutboxTx(tx).OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: []int64{id}, At: time.Now()}); err != nil {
		t.Error(err)
		return
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Error(err)
	}
}

// A late outcome that arrives while a round of the same relay is under way
// is applied once that round has ended, never during it: the round's
// transaction and the late marks lock rows in different orders, and run at
// once they deadlocked (seen in idemd's end-to-end Kafka outage test,
// PostgreSQL aborting one of them after deadlock_timeout).
//
// PostgreSQL's drivers only: there several rounds of a relay run at once;
// SQLite's relay runs one at a time under its lease.
func TestLateOutcomeWaitsForTheRoundUnderWay(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) { t.Parallel(); checkLateWaitsForRound(t, testdb.Postgres(t)) })
	t.Run("pgsqldriver", func(t *testing.T) { t.Parallel(); checkLateWaitsForRound(t, testdb.PostgresSQL(t)) })
}

func checkLateWaitsForRound[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	d1, z := mustEvent(t, "k"), mustEvent(t, "z")
	var (
		lateOf     = make(chan func(int, error), 1)
		inRound2   = make(chan struct{})
		endRound2  = make(chan struct{})
		round2Done atomic.Bool
	)
	pub := &latePublisher{fn: func(call int, events []event.Envelope, late func(int, error)) error {
		switch call {
		case 1: // d1: outcome unknown, learned later
			lateOf <- late
			return &outbox.PublishError{Errs: []error{errUnknown}}
		case 2: // z: a round under way when d1's outcome comes
			close(inRound2)
			<-endRound2
			round2Done.Store(true)
		}
		return nil
	}}
	var m marked
	wake := make(chan struct{}, 1)
	relay := newLateRelay(t, drv, pub, func(c *outbox.RelayConfig) { c.Wake = wake; c.OnPublished = m.on })
	enqueueTx(t, drv, d1)
	runInBackground(t, relay)
	var ending sync.Once
	end := func() { ending.Do(func() { close(endRound2) }) }
	t.Cleanup(end) // before the relay's: a failed test does not hang in round 2
	late := <-lateOf
	enqueueTx(t, drv, z)
	wake <- struct{}{}
	select {
	case <-inRound2:
	case <-time.After(10 * time.Second):
		t.Fatal("no second round")
	}
	late(0, nil)
	time.Sleep(300 * time.Millisecond) // time enough to apply it, were it not held back
	if m.has(d1.ID) {
		t.Fatal("the late outcome was applied while a round was under way")
	}
	end()
	// OnPublished runs after the late mark's commit: wait for it too.
	eventually(t, 5*time.Second, "every event published, and the late one reported", func() bool {
		return allPublished(t, drv) && m.has(d1.ID)
	})
	if !round2Done.Load() {
		t.Fatal("the late outcome applied before the round under way ended")
	}
	if n := pub.given(d1.ID); n != 1 {
		t.Errorf("event published late given to Publish %d times; want once", n)
	}
}

// A round that parks an event (poison, or its MaxAttempts-th failure) that
// was marked published while the round published it (by the late outcome
// of an earlier attempt, maybe another relay's) parks nothing: its park
// finds no pending row. It neither logs the event parked nor reports it
// to OnPark: both said so of a published event, and an operator went
// looking for a park that blocked nothing (idemd counted it in
// idemd_outbox_parked_total).
func TestRoundReportsNoParkOfAnEventPublishedMeanwhile(t *testing.T) {
	t.Parallel()
	for _, poison := range []bool{true, false} {
		t.Run(map[bool]string{true: "poison", false: "max-attempts"}[poison], func(t *testing.T) {
			t.Parallel()
			onEveryBackend(t,
				func(t *testing.T, drv driver.OutboxDriver[*sql.Tx]) { checkNoParkOfPublished(t, drv, poison) },
				func(t *testing.T, drv driver.OutboxDriver[pgx.Tx]) { checkNoParkOfPublished(t, drv, poison) })
		})
	}
}

func checkNoParkOfPublished[TTx any](t *testing.T, drv driver.OutboxDriver[TTx], poison bool) {
	d1 := mustEvent(t, "k")
	var d1Row atomic.Int64
	pub := &latePublisher{fn: func(call int, events []event.Envelope, _ func(int, error)) error {
		errs := make([]error, len(events))
		for i, e := range events {
			if e.ID != d1.ID {
				continue
			}
			errs[i] = errUnknown
			if call == 2 {
				// Another relay marks it published meanwhile, and this
				// attempt fails it for good.
				markPublished(t, drv, d1Row.Load())
				if poison {
					errs[i] = fmt.Errorf("%w: too large", outbox.ErrPoison)
				}
			}
		}
		return &outbox.PublishError{Errs: errs}
	}}
	var parks atomic.Int64
	logs := &testlog.Buffer{}
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff:     func(int) time.Duration { return 0 },
		MaxAttempts: 2,
		NoListen:    true,
		OnPark:      func(event.Envelope, int, error) { parks.Add(1) },
		Logger:      slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueueTx(t, drv, d1)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("first round: no error; want the publish failure")
	}
	d1Row.Store(rowIDOf(t, drv, d1.ID))
	_, _ = relay.RunOnce(t.Context())
	if !allPublished(t, drv) {
		t.Fatal("d1, marked published during the round, is pending again")
	}
	if n, err := outbox.CountParked(t.Context(), drv); err != nil || n != 0 {
		t.Fatalf("CountParked = %d, %v; want 0", n, err)
	}
	if parks.Load() != 0 || strings.Contains(logs.String(), "parked as poison") {
		t.Errorf("OnPark called %d times for an event published, not parked; logs:\n%s", parks.Load(), logs)
	}
}
