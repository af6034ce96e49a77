package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/flaplog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/saga"
)

// Stale is an order still CREATED.
type Stale struct {
	ID        int64
	CreatedAt time.Time
}

// StaleLister lists the orders still CREATED that were created before a
// time, with IDs above afterID, in ID order (a page of at most limit; the
// next page starts after the last ID). Both stores implement it.
type StaleLister interface {
	ListCreatedBefore(ctx context.Context, before time.Time, afterID int64, limit int) ([]Stale, error)
}

// DeclinedPrefix starts the recorded result of a charge-payment step that
// charged nothing (the watchdog gave up on the saga before its charge).
const DeclinedPrefix = "declined:"

// WatchdogConfig configures a Watchdog.
type WatchdogConfig struct {
	// StuckAfter is how long an order may stay CREATED before its events
	// are published again from the outbox (same event IDs: the inboxes
	// drop what was applied), every round until RedriveFor; events
	// published again less than Interval/2 before the round (by another
	// replica's watchdog, sharing the database) are left alone, so that
	// several watchdogs publish them again once or twice a round, not
	// once each. Required.
	StuckAfter time.Duration
	// GiveUpAfter is how long an order may stay CREATED before the
	// watchdog stops waiting: a saga that charged nothing is aborted (its
	// charge step recorded as declined, so a late event cannot charge;
	// the compensator then REJECTs the order); a saga that charged is
	// reported to an operator (log and metric) every round. Must exceed
	// StuckAfter. It counts from the order's creation, or from the last
	// round that found the order's events waiting to be published, or
	// from the watchdog's start, whichever is latest: a backlog published
	// at the end of an outage (or before the first round) is late, and
	// the consumers get GiveUpAfter to work through it.
	GiveUpAfter time.Duration
	// RedriveFor is how long after an order's creation its events may be
	// published again; 0 means for ever, and it must exceed StuckAfter
	// otherwise. Set it below the inboxes' retention (cleanup's Inbox.TTL)
	// minus the longest a consumer may take to read a copy published
	// again: the inboxes forget an event Inbox.TTL after they applied it
	// (at the earliest, the order's creation), and a copy read after that
	// is applied again (the projection counts the order twice). Past it,
	// an order whose payment was captured is still reported to an
	// operator every round, its events no longer published again.
	RedriveFor time.Duration
	// Interval is the time between rounds; 0 means StuckAfter/2, at
	// least a second and at most 30 s.
	Interval time.Duration
	// RoundTimeout bounds a round; 0 means DefaultRoundTimeout. A round
	// whose statement went on a connection the network black-holes (a
	// partition that closes nothing: a failover behind a load balancer
	// or NAT) fails then, logged and reported (Partial), instead of
	// waiting as long as TCP does (about 15 min) with nothing reported;
	// the next round goes on another connection.
	RoundTimeout time.Duration
	// Limit is the page size of the listing of stale orders; 0 means
	// 500. A round reads every page.
	Limit int
	// Now is the watchdog's clock; nil means time.Now. Its start is Now()
	// at NewWatchdog.
	Now func() time.Time
	// OnRound, if set, is called after each round, a round that failed
	// or was cut short included (WatchdogStats.Partial): its counts of
	// actions are what it did, its gauges are not the database's.
	OnRound func(WatchdogStats)
}

// WatchdogStats is what one round did.
type WatchdogStats struct {
	// Stuck orders whose events were published again, and how many
	// events that was.
	Stuck, Redriven int
	// Aborted sagas (nothing charged: their orders become REJECTED),
	// each counted by the round that aborted it.
	Aborted int
	// Operator: orders whose payment was captured, or whose saga failed
	// (its compensation kept failing), but which did not move for
	// GiveUpAfter; and orders whose saga was aborted but is still
	// compensating a round (Interval, at least 30 s) after this watchdog
	// first found it so (the compensator keeps failing on the database,
	// or is stuck).
	Operator int
	// Waiting: orders past GiveUpAfter not given up because the outbox
	// holds events older than them that are not published yet (the
	// relay or Kafka is down or behind, or an event is parked), or held
	// them less than GiveUpAfter ago (or the watchdog started less than
	// GiveUpAfter ago): their events are late, not lost.
	Waiting int
	// Partial is set when the round stopped early (an error, or the
	// context ended): Stuck, Redriven and Aborted count what it did
	// before (its aborts are committed, and the next round does not
	// count them again), while Operator and Waiting are partial counts
	// of the orders, not to be taken for the database's.
	Partial bool
}

// Watchdog drives the orders whose saga stopped moving: an event lost
// between the outbox and a consumer (a broker that lost its log, a topic
// deleted) leaves an order CREATED for good, since nothing else would
// publish it again.
type Watchdog[TTx any] struct {
	drv  driver.Driver[TTx]
	ps   *PaymentSaga[TTx]
	list StaleLister
	cfg  WatchdogConfig
	log  *slog.Logger
	// roundLog limits the lines of Run's failed rounds.
	roundLog flaplog.Limiter

	mu sync.Mutex
	// late is when a round last found events waiting to be published
	// that are older than an order past GiveUpAfter (initially the
	// watchdog's start): an order created before it is given up only
	// GiveUpAfter after it.
	late time.Time
	// compensating holds the orders past GiveUpAfter whose saga the last
	// rounds found aborted but not compensated yet, with when a round
	// first did.
	compensating map[int64]time.Time
}

// NewWatchdog returns a watchdog of the sagas of ps over drv's outbox.
func NewWatchdog[TTx any](drv driver.Driver[TTx], ps *PaymentSaga[TTx], list StaleLister, cfg WatchdogConfig, log *slog.Logger) (*Watchdog[TTx], error) {
	if cfg.StuckAfter <= 0 || cfg.GiveUpAfter <= cfg.StuckAfter {
		return nil, fmt.Errorf("orders: watchdog: want 0 < StuckAfter (%s) < GiveUpAfter (%s)", cfg.StuckAfter, cfg.GiveUpAfter)
	}
	if cfg.RedriveFor < 0 || (cfg.RedriveFor > 0 && cfg.RedriveFor <= cfg.StuckAfter) {
		return nil, fmt.Errorf("orders: watchdog: want RedriveFor (%s) 0 (for ever) or above StuckAfter (%s)", cfg.RedriveFor, cfg.StuckAfter)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = min(max(cfg.StuckAfter/2, time.Second), 30*time.Second)
	}
	if cfg.RoundTimeout <= 0 {
		cfg.RoundTimeout = DefaultRoundTimeout
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 500
	}
	if log == nil {
		log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watchdog[TTx]{drv: drv, ps: ps, list: list, cfg: cfg, log: log, late: cfg.Now(), compensating: map[int64]time.Time{}}, nil
}

// DefaultRoundTimeout is WatchdogConfig.RoundTimeout's default.
const DefaultRoundTimeout = time.Minute

// Run runs a round every Interval, each within RoundTimeout, until ctx
// ends; it returns nil then.
func (w *Watchdog[TTx]) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, w.cfg.RoundTimeout)
		st, err := w.RunOnce(rctx)
		if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("not done within %s (the database does not answer?): %w", w.cfg.RoundTimeout, err)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			switch a, ep := w.roundLog.Failed(w.cfg.Now()); a {
			case flaplog.Start:
				w.log.WarnContext(ctx, "order watchdog: round failed", "err", err)
			case flaplog.Summary:
				w.log.WarnContext(ctx, "order watchdog: rounds still failing; repeats are logged at most every "+flaplog.Interval.String(),
					"err", err, "suppressed", ep.Suppressed, "failed_rounds", ep.Failures, "rounds_ok", ep.Successes, "since", ep.First)
			}
		default:
			if a, ep := w.roundLog.Succeeded(w.cfg.Now()); a == flaplog.End {
				w.log.InfoContext(ctx, "order watchdog: rounds succeed again; none failed for "+flaplog.Quiet.String(),
					"failed_rounds", ep.Failures, "rounds_ok", ep.Successes, "since", ep.First, "last_failure", ep.Last)
			}
		}
		if w.cfg.OnRound != nil {
			// A round cut short is reported too (Partial): the sagas
			// it aborted are committed, and no later round counts
			// them.
			w.cfg.OnRound(st)
		}
	}
}

// compensatingGrace is the least time the watchdog gives an aborted saga
// to be compensated (a round, if longer) before it reports it: the
// compensator is woken by the abort and normally finishes in
// milliseconds, or a few seconds when an attempt is retried.
const compensatingGrace = 30 * time.Second

// redriveKeys is the most keys one Redrive names (SQLite binds each).
const redriveKeys = 500

// unpublishedSlack absorbs the clock difference between the replica that
// stored an order and the one that enqueued an event.
const unpublishedSlack = time.Minute

// RunOnce looks at the orders CREATED more than StuckAfter ago once. On an
// error it returns what it did so far, marked Partial.
func (w *Watchdog[TTx]) RunOnce(ctx context.Context) (st WatchdogStats, err error) {
	// compensating: this round's orders whose saga is aborted but not
	// compensated yet, with when a round first found them so.
	compensating := map[int64]time.Time{}
	defer func() {
		st.Partial = err != nil
		w.mu.Lock()
		defer w.mu.Unlock()
		if st.Partial {
			// The orders the round did not reach are still as the
			// last round found them.
			for id, at := range compensating {
				w.compensating[id] = at
			}
			return
		}
		w.compensating = compensating
	}()
	var (
		// keys are the stuck orders whose events are redriven, and
		// chargedKeys those reported to an operator that are redriven
		// too (still worth a try).
		keys, chargedKeys []string
		waiting           []int64
		// published: orders past GiveUpAfter whose events may have
		// been published less than GiveUpAfter ago.
		published []int64
		now       = w.cfg.Now()
		after     int64
		// oldest unpublished event, read once per round when needed.
		oldest     time.Time
		anyPending bool
		readOldest bool
	)
	for {
		stale, err := w.list.ListCreatedBefore(ctx, now.Add(-w.cfg.StuckAfter), after, w.cfg.Limit)
		if err != nil {
			return st, err
		}
		for _, o := range stale {
			after = o.ID
			// Its events are published again only while the inboxes
			// still remember the copies they applied: one they forgot
			// would be applied again.
			redrive := w.cfg.RedriveFor == 0 || now.Sub(o.CreatedAt) < w.cfg.RedriveFor
			if o.CreatedAt.After(now.Add(-w.cfg.GiveUpAfter)) {
				if redrive {
					keys = append(keys, strconv.FormatInt(o.ID, 10))
				}
				continue
			}
			if !readOldest {
				if oldest, anyPending, err = w.drv.Outbox().OutboxOldestUnpublished(ctx); err != nil {
					return st, fmt.Errorf("orders: watchdog: oldest unpublished event: %w", err)
				}
				readOldest = true
			}
			if anyPending && oldest.Before(o.CreatedAt.Add(unpublishedSlack)) {
				// Events from before this order wait to be published:
				// the relay or the broker is down or behind, nothing
				// is lost yet. Rejecting the order would punish the
				// customer for an outage.
				st.Waiting++
				waiting = append(waiting, o.ID)
				w.mu.Lock()
				w.late = now
				w.mu.Unlock()
				continue
			}
			w.mu.Lock()
			late := w.late
			w.mu.Unlock()
			// Its events may have been published only since late (the
			// end of an outage, or before this watchdog's first round):
			// the consumers may still be working through the backlog.
			// Nothing is aborted then (late, not lost), but an order
			// that needs an operator is still reported.
			grace := o.CreatedAt.Before(late) && now.Sub(late) < w.cfg.GiveUpAfter
			var outcome giveUpOutcome
			if grace {
				outcome, err = w.peek(ctx, o.ID)
			} else {
				outcome, err = w.giveUp(ctx, o.ID)
			}
			switch {
			case err != nil:
				if ctx.Err() != nil {
					return st, ctx.Err()
				}
				w.log.WarnContext(ctx, "order watchdog: give up failed", "order", o.ID, "err", err)
			case outcome == giveUpWouldAbort:
				st.Waiting++
				published = append(published, o.ID)
			case outcome == giveUpMoved:
				// It moved since the listing: nothing to do.
			case outcome == giveUpAborting:
				// Its abort (counted when it was made) waits for the
				// compensator, which normally finishes within seconds:
				// still waiting a round later, it cannot (its
				// compensation fails on the database every time, or
				// the compensator is stuck).
				w.mu.Lock()
				since, ok := w.compensating[o.ID]
				w.mu.Unlock()
				if !ok {
					since = now
				}
				compensating[o.ID] = since
				if now.Sub(since) >= max(w.cfg.Interval, compensatingGrace) {
					st.Operator++
					w.log.ErrorContext(ctx, "order watchdog: order stuck, its saga was aborted but is still compensating (the compensator cannot REJECT it: see its 'compensation failed' warnings), an operator should look",
						"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt), "seen_compensating_since", FormatTime(since))
				}
			case outcome == giveUpCharged:
				st.Operator++
				w.log.ErrorContext(ctx, "order watchdog: order stuck with a captured payment, needs an operator",
					"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt), "events_published_again", redrive)
				if redrive {
					chargedKeys = append(chargedKeys, strconv.FormatInt(o.ID, 10)) // still worth a try
				}
			case outcome == giveUpFailed:
				st.Operator++
				w.log.ErrorContext(ctx, "order watchdog: order stuck, its saga failed (a compensation kept failing; the compensator tries it again every "+
					FailedRetryInterval.String()+" unless a step of it cannot be compensated, an operator should look)",
					"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt))
			default:
				st.Aborted++
				compensating[o.ID] = now
				w.log.WarnContext(ctx, "order watchdog: saga aborted, nothing was charged; the order will be REJECTED",
					"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt))
			}
		}
		if len(stale) < w.cfg.Limit {
			break
		}
	}
	if len(waiting) > 0 {
		w.log.WarnContext(ctx, "order watchdog: not giving up on orders whose events are not published yet (relay or Kafka down or behind, or an event parked)",
			"orders", len(waiting), "first", waiting[0], "oldest_unpublished", FormatTime(oldest), "give_up_after", w.cfg.GiveUpAfter.String())
	}
	if len(published) > 0 {
		w.mu.Lock()
		late := w.late
		w.mu.Unlock()
		w.log.InfoContext(ctx, "order watchdog: not giving up yet on orders whose events were waiting to be published lately (an outage ended, or idemd started): the consumers get -saga-give-up-after from then",
			"orders", len(published), "first", published[0], "since", FormatTime(late), "give_up_after", w.cfg.GiveUpAfter.String())
	}
	stuck := len(keys)
	keys = append(keys, chargedKeys...)
	if len(keys) == 0 {
		return st, nil
	}
	for i := 0; i < len(keys); i += redriveKeys {
		chunk := keys[i:min(i+redriveKeys, len(keys))]
		// Only the events not published (again) within half a round:
		// every replica runs a watchdog, and without the bound each
		// one published the same stuck orders' events again at each
		// of its rounds, N replicas N times a round.
		n, err := outbox.Redrive(ctx, w.drv, outbox.RedriveOptions{Keys: chunk, Before: now.Add(-w.cfg.Interval / 2)})
		st.Redriven += n
		if err != nil {
			return st, err
		}
		// The stuck orders (not the charged ones, at the end) of the
		// chunk: their events were published again.
		st.Stuck += max(0, min(i+len(chunk), stuck)-i)
	}
	n := st.Redriven
	if n > 0 {
		w.log.WarnContext(ctx, "order watchdog: orders not moving, their events published again",
			"orders", len(keys), "events", n, "stuck_after", w.cfg.StuckAfter.String())
	}
	return st, nil
}

// giveUpOutcome is what giveUp did.
type giveUpOutcome int

const (
	giveUpAborted    giveUpOutcome = iota // nothing charged: aborted
	giveUpCharged                         // a payment was captured, the order is not confirmed yet
	giveUpFailed                          // the saga failed: its compensation kept failing
	giveUpMoved                           // the saga finished since the listing: the order is no longer CREATED
	giveUpAborting                        // aborted before (counted then), not compensated yet: the order is still CREATED
	giveUpWouldAbort                      // peek: nothing charged, giveUp would abort it
)

// settledOutcome is what giveUp (and peek) answer for a saga in state st
// without looking at its steps; settled is false for a running saga.
func settledOutcome(st saga.State) (outcome giveUpOutcome, settled bool) {
	switch st {
	case saga.Running:
		return 0, false
	case saga.Failed:
		return giveUpFailed, true
	case saga.Compensating:
		// Aborted already (by an earlier round, another replica's
		// watchdog or the saga itself): the compensator REJECTs it.
		return giveUpAborting, true
	case saga.Completed, saga.Compensated:
		// Finished between the listing and now (the order was
		// confirmed, or rejected, in the saga's last transaction):
		// not stuck.
		return giveUpMoved, true
	default:
		return giveUpCharged, true
	}
}

// peek is what giveUp would do with order id, without changing anything:
// giveUpWouldAbort where giveUp would abort.
func (w *Watchdog[TTx]) peek(ctx context.Context, id int64) (giveUpOutcome, error) {
	s, err := w.ps.sagas.Get(ctx, SagaID(id))
	switch {
	case errors.Is(err, saga.ErrNotFound):
		return giveUpWouldAbort, nil // no event ever started it
	case err != nil:
		return giveUpWouldAbort, err
	}
	if outcome, settled := settledOutcome(s.State); settled {
		return outcome, nil
	}
	for _, st := range s.Steps {
		if st.Name == StepCharge && !st.Compensation && !declined(st.Result) {
			return giveUpCharged, nil
		}
	}
	return giveUpWouldAbort, nil
}

// giveUp aborts the saga of order id unless it charged a payment, in one
// transaction: it starts the saga if no event ever did, records its
// place-order step, and claims its charge-payment step as declined, so
// that a late OrderCreated.v1 finds the step taken and charges nothing;
// then RunCompensator REJECTs the order. Nothing is changed when the charge
// step had charged a payment (giveUpCharged), the saga failed
// (giveUpFailed), it finished since the round listed the order, which is
// then CONFIRMED or REJECTED (giveUpMoved), or it was aborted already and
// waits for the compensator (giveUpAborting).
func (w *Watchdog[TTx]) giveUp(ctx context.Context, id int64) (outcome giveUpOutcome, err error) {
	tx, err := w.drv.Begin(ctx)
	if err != nil {
		return giveUpAborted, err
	}
	commit := false
	defer func() {
		if !commit {
			_ = w.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	sagaID := SagaID(id)
	s, _, err := w.ps.sagas.StartTx(ctx, tx, sagaID, SagaType, nil)
	if err != nil {
		return giveUpAborted, err
	}
	if outcome, settled := settledOutcome(s.State); settled {
		return outcome, nil
	}
	if _, _, err := w.ps.sagas.StepTx(ctx, tx, sagaID, StepPlace, func(context.Context, TTx) ([]byte, error) {
		return []byte(strconv.FormatInt(id, 10)), nil
	}); err != nil {
		return giveUpAborted, err
	}
	res, _, err := w.ps.sagas.StepTx(ctx, tx, sagaID, StepCharge, func(context.Context, TTx) ([]byte, error) {
		return []byte(DeclinedPrefix + "saga stuck, given up by the watchdog"), nil
	})
	if err != nil {
		return giveUpAborted, err
	}
	if !strings.HasPrefix(string(res), DeclinedPrefix) {
		return giveUpCharged, nil
	}
	if err := w.ps.sagas.AbortTx(ctx, tx, sagaID); err != nil && !errors.Is(err, saga.ErrState) {
		return giveUpAborted, err
	}
	if err := w.drv.Commit(ctx, tx); err != nil {
		return giveUpAborted, err
	}
	commit = true
	return giveUpAborted, nil
}
