package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/observe"
)

// roundResult is what one round did.
type roundResult struct {
	claimed       int
	published     int
	publishFailed bool
	// claimTook is how long the claim took (0 if the round failed before).
	claimTook time.Duration
	// retryAt is when the event this round backed off becomes due (zero if
	// none).
	retryAt time.Time
}

func (r *Relay[TTx]) round(ctx context.Context) (res roundResult, err error) {
	if r.late != nil {
		// Late outcomes are marked between this relay's rounds, never
		// while one holds its rows (see markLate).
		r.lateGate.RLock()
		defer r.lateGate.RUnlock()
	}
	if !r.locking {
		r.mu.Lock()
		defer r.mu.Unlock()
	}

	detached := context.WithoutCancel(ctx)
	var (
		tx      TTx
		ex      driver.OutboxExecutor
		inTx    bool
		claimer = r.drv.Outbox()
	)
	begin := func(ctx context.Context) error {
		var err error
		if tx, err = r.drv.Begin(ctx); err != nil {
			return fmt.Errorf("outbox: begin: %w", err)
		}
		inTx = true
		ex = r.drv.OutboxTx(tx)
		return nil
	}
	// cancelTx ends the context the transaction was begun on (in locking
	// mode the claim's, otherwise the marks'). It runs after the deferred
	// rollback, not before: database/sql rolls a transaction back
	// asynchronously when that context ends, and the explicit Rollback
	// then returned at once (sql.ErrTxDone) with the locks still held: the
	// rows', so a relay's next round skipped them, or SQLite's write lock.
	cancelTx := context.CancelFunc(func() {})
	defer func() {
		if inTx { // also on panic (a crashed publisher): the claim is released
			rctx, cancel := context.WithTimeout(detached, finishTimeout)
			_ = r.drv.Rollback(rctx, tx)
			cancel()
		}
		cancelTx()
	}()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	// claimed, once the claim returned, tells whether the transaction
	// may outlive ctx (it always may outside locking mode).
	claimed := func() bool { return true }
	claimCtx, cancelClaim := ctx, context.CancelFunc(func() {})
	if r.locking {
		// Begun on a context detached from ctx once the claim returned:
		// database/sql ties a transaction to the context of BeginTx, and
		// the marks must outlive a shutdown; but a Begin waiting for a
		// connection (an exhausted pool, an unreachable server) must end
		// with ctx, or a shutdown waits for it, and within claimTimeout:
		// a connection cut off without a reset would otherwise hold the
		// round until TCP gives up (for ever, behind a middlebox that
		// acknowledges).
		claimCtx, cancelClaim = context.WithTimeout(ctx, claimTimeout)
		defer cancelClaim()
		var txCtx context.Context
		txCtx, cancelTx = context.WithCancel(detached)
		claimed = context.AfterFunc(claimCtx, cancelTx)
		defer claimed() // unregistered on every return, failures included
		if err := begin(txCtx); err != nil {
			return res, r.claimError(ctx, claimCtx, err)
		}
		claimer = ex
	}

	claimStart := time.Now()
	rows, err := claimer.OutboxClaimBatch(claimCtx, &driver.OutboxClaimBatchParams{
		Now: r.cfg.Now(), Limit: r.cfg.BatchSize, MaxBytes: r.cfg.BatchBytes, HoldTimeout: r.holdTimeout(),
	})
	res.claimTook = time.Since(claimStart)
	if err != nil {
		return res, r.claimError(ctx, claimCtx, fmt.Errorf("outbox: claim: %w", err))
	}
	if !claimed() {
		// ctx ended (or claimTimeout passed) as the claim returned: the
		// transaction is being cancelled; publish nothing (the deferred
		// rollback frees it).
		return res, r.claimError(ctx, claimCtx, claimCtx.Err())
	}
	cancelClaim()
	res.claimed = len(rows)
	if len(rows) == 0 {
		r.logQuiet(r.cfg.Now())
		return res, nil
	}
	rows, events, bad := decode(rows)

	if r.cfg.Tracer != nil {
		var span observe.Span
		ctx, span = observe.StartBatch(ctx, r.cfg.Tracer, observe.KindClient, observe.DefaultPropagator(), "idem.outbox.relay.batch", len(events),
			func(i int, k string) string { return events[i].Headers[k] },
			observe.Int("idem.events", res.claimed))
		defer func() {
			span.SetAttributes(observe.Int("idem.published", res.published), observe.Int("idem.failed", res.claimed-res.published))
			// A panicking publisher ends the span failed, and panics on.
			if p := recover(); p != nil {
				observe.End(span, fmt.Errorf("panic: %v", p))
				panic(p)
			}
			observe.End(span, err)
		}()
	}

	var (
		pubErr error
		outs   []error
		marked bool // the marks committed
	)
	if len(events) > 0 {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		if r.latePub != nil {
			// The late outcomes (see LatePublisher) wait for the marks:
			// an event marked published before them would fail its mark
			// as failed; if they fail, its events are claimed again.
			lr := &lateRound{q: r.late, rows: rows, events: events}
			defer func() { lr.settle(marked, outs) }()
			pubErr = r.latePub.PublishLate(pctx, events, lr.report)
		} else {
			pubErr = r.pub.Publish(pctx, events)
		}
		cancel()
	}
	outs = outcomes(pubErr, len(events))
	o := r.sortOutcomes(rows, events, outs, ctx.Err() != nil)

	// Mark what happened, even if ctx ended while publishing.
	fctx, cancel := context.WithTimeout(detached, finishTimeout)
	if r.lease != nil {
		// Marks that commit after the lease expired could land after
		// another relay read the same events: they fail instead, and
		// the events are published again (same IDs), as after a crash.
		var c2 context.CancelFunc
		fctx, c2 = context.WithDeadline(fctx, time.Unix(0, r.leaseUntil.Load()))
		c1 := cancel
		cancel = func() { c2(); c1() }
	}
	if inTx {
		defer cancel()
	} else {
		// Outside locking mode the marks' transaction is begun on fctx:
		// it ends after the deferred rollback, as cancelTx does in
		// locking mode (a failed mark left SQLite's write lock held
		// after RunOnce returned).
		cancelTx = cancel
		if err := begin(fctx); err != nil {
			return res, err
		}
	}
	now := r.cfg.Now()
	if len(o.published) > 0 {
		if err := ex.OutboxMarkPublished(fctx, &driver.OutboxMarkPublishedParams{IDs: o.published, At: now}); err != nil {
			return res, fmt.Errorf("outbox: mark %d events published: %w", len(o.published), err)
		}
	}
	for _, b := range bad {
		o.failed = append(o.failed, failedRow{row: b.row, err: b.err, park: true})
	}
	var retryAt time.Time
	for i := range o.failed {
		f := &o.failed[i]
		f.row.Attempts++
		if f.park {
			// ErrNotFound: published meanwhile, by the late outcome of an
			// earlier attempt (see LatePublisher), maybe another relay's.
			// Then nothing is parked: neither logged nor reported to
			// OnPark.
			if err := ex.OutboxPark(fctx, &driver.OutboxParkParams{ID: f.row.ID, Error: storedError(f.err), At: now}); errors.Is(err, driver.ErrNotFound) {
				f.gone = true
			} else if err != nil {
				return res, fmt.Errorf("outbox: park event %s: %w", f.row.EventID, err)
			}
			continue
		}
		f.retryIn = r.cfg.Backoff(f.row.Attempts)
		at := now.Add(f.retryIn)
		if err := ex.OutboxMarkFailed(fctx, &driver.OutboxMarkFailedParams{ID: f.row.ID, Error: storedError(f.err), NextAttempt: at}); err != nil && !errors.Is(err, driver.ErrNotFound) {
			return res, fmt.Errorf("outbox: mark event %s failed: %w", f.row.EventID, err)
		}
		if retryAt.IsZero() || at.Before(retryAt) {
			retryAt = at
		}
	}
	if err := r.drv.Commit(fctx, tx); err != nil {
		return res, fmt.Errorf("outbox: commit marks: %w", err)
	}
	inTx = false
	marked = true
	res.published = len(o.published)
	res.retryAt = retryAt

	if len(o.events) > 0 && r.cfg.OnPublished != nil {
		r.cfg.OnPublished(o.events)
	}
	r.logFailures(ctx, o)
	if o.disordered > 0 {
		r.cfg.Logger.ErrorContext(ctx, "outbox: the publisher published events of a key after an earlier event of that key failed; per-key order is broken",
			"events", o.disordered)
	}
	if o.firstErr != nil {
		res.publishFailed = true
		return res, fmt.Errorf("outbox: %d of %d events not published: %w", len(events)-len(o.published), len(events), pubErr)
	}
	if len(o.published) == 0 && o.skipped > 0 && ctx.Err() == nil {
		// The publisher held back every event (ErrSkipped: a circuit
		// breaker, a rate limit). No attempt is counted, but the round
		// failed: Run backs off instead of handing the same batch over
		// again at once, round after round.
		res.publishFailed = true
		err := fmt.Errorf("outbox: the publisher skipped all %d events: %w", len(events), pubErr)
		if log, g := r.failures.failed(storedError(err), r.cfg.Now()); log {
			r.cfg.Logger.WarnContext(ctx, "outbox: the publisher skipped every event of the round; backing off (repeats are logged at most every "+failureLogInterval.String()+")",
				"events", len(events), "skipped_rounds", g.rounds, "suppressed", g.suppressed, "err", err)
		}
		return res, err
	}
	return res, nil
}

// claimTimeout bounds the Begin and the claim of a round on a backend with
// concurrent writers (PostgreSQL): a few milliseconds when the database
// answers.
const claimTimeout = 15 * time.Second

// claimError is the error of a round whose Begin or claim failed with err:
// ctx's error if ctx ended, and err said to have outlived claimTimeout if
// claimCtx's deadline passed.
func (r *Relay[TTx]) claimError(ctx, claimCtx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(claimCtx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("outbox: begin and claim not done within %s (a database that does not answer, a connection cut off, no free connection in the pool): %w",
			claimTimeout, err)
	}
	return err
}

// decode turns claimed rows into envelopes. A row that cannot be decoded is
// poison: it is returned in bad, and the later rows of its key are dropped
// from the batch so they are not published before it.
func decode(rows []driver.OutboxRow) (kept []driver.OutboxRow, events []event.Envelope, bad []failedRow) {
	kept = rows[:0:0]
	var blocked map[string]bool
	for _, row := range rows {
		if blocked[row.Key] {
			continue
		}
		e, err := toEnvelope(row)
		if err != nil {
			bad = append(bad, failedRow{row: row, err: err})
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[row.Key] = true
			continue
		}
		kept = append(kept, row)
		events = append(events, e)
	}
	return kept, events, bad
}

// maxStoredError bounds the error text stored with a failed or parked
// event (last_error): longer texts are cut.
const maxStoredError = 4096

// storedError is the text of err as the outbox stores it: valid UTF-8
// without NUL bytes (PostgreSQL refuses both in a text column, which
// rolled back the marks of the whole round), at most maxStoredError.
// A publisher may put raw broker output in its errors.
func storedError(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "\uFFFD")
	if len(s) > maxStoredError {
		cut := maxStoredError - len("…")
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
