package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/saga"
)

// Stale is an order still CREATED.
type Stale struct {
	ID        int64
	CreatedAt time.Time
}

// StaleLister lists the orders still CREATED that were created before a
// time, oldest first. Both stores implement it.
type StaleLister interface {
	ListCreatedBefore(ctx context.Context, before time.Time, limit int) ([]Stale, error)
}

// DeclinedPrefix starts the recorded result of a charge-payment step that
// charged nothing (the watchdog gave up on the saga before its charge).
const DeclinedPrefix = "declined:"

// WatchdogConfig configures a Watchdog.
type WatchdogConfig struct {
	// StuckAfter is how long an order may stay CREATED before its events
	// are published again from the outbox (same event IDs: the inboxes
	// drop what was applied). Required.
	StuckAfter time.Duration
	// GiveUpAfter is how long an order may stay CREATED before the
	// watchdog stops waiting: a saga that charged nothing is aborted (its
	// charge step recorded as declined, so a late event cannot charge;
	// the compensator then REJECTs the order); a saga that charged is
	// reported to an operator (log and metric) every round. Must exceed
	// StuckAfter.
	GiveUpAfter time.Duration
	// Interval is the time between rounds; 0 means StuckAfter/2, at
	// least a second and at most 30 s.
	Interval time.Duration
	// Limit bounds the orders of one round; 0 means 500.
	Limit int
	// OnRound, if set, is called after each round.
	OnRound func(WatchdogStats)
}

// WatchdogStats is what one round did.
type WatchdogStats struct {
	// Stuck orders whose events were published again, and how many
	// events that was.
	Stuck, Redriven int
	// Aborted sagas (nothing charged: their orders become REJECTED).
	Aborted int
	// Operator: orders whose payment was captured but which did not move
	// for GiveUpAfter.
	Operator int
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
}

// NewWatchdog returns a watchdog of the sagas of ps over drv's outbox.
func NewWatchdog[TTx any](drv driver.Driver[TTx], ps *PaymentSaga[TTx], list StaleLister, cfg WatchdogConfig, log *slog.Logger) (*Watchdog[TTx], error) {
	if cfg.StuckAfter <= 0 || cfg.GiveUpAfter <= cfg.StuckAfter {
		return nil, fmt.Errorf("orders: watchdog: want 0 < StuckAfter (%s) < GiveUpAfter (%s)", cfg.StuckAfter, cfg.GiveUpAfter)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = min(max(cfg.StuckAfter/2, time.Second), 30*time.Second)
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 500
	}
	if log == nil {
		log = slog.Default()
	}
	return &Watchdog[TTx]{drv: drv, ps: ps, list: list, cfg: cfg, log: log}, nil
}

// Run runs a round every Interval until ctx ends; it returns nil then.
func (w *Watchdog[TTx]) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := w.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.WarnContext(ctx, "order watchdog: round failed", "err", err)
		}
		if w.cfg.OnRound != nil {
			w.cfg.OnRound(st)
		}
	}
}

// RunOnce looks at the orders CREATED more than StuckAfter ago once.
func (w *Watchdog[TTx]) RunOnce(ctx context.Context) (WatchdogStats, error) {
	var st WatchdogStats
	now := time.Now()
	stale, err := w.list.ListCreatedBefore(ctx, now.Add(-w.cfg.StuckAfter), w.cfg.Limit)
	if err != nil {
		return st, err
	}
	var keys []string
	for _, o := range stale {
		if o.CreatedAt.After(now.Add(-w.cfg.GiveUpAfter)) {
			keys = append(keys, strconv.FormatInt(o.ID, 10))
			continue
		}
		charged, err := w.GiveUp(ctx, o.ID)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
			w.log.WarnContext(ctx, "order watchdog: give up failed", "order", o.ID, "err", err)
		case charged:
			st.Operator++
			w.log.ErrorContext(ctx, "order watchdog: order stuck with a captured payment, needs an operator",
				"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt))
			keys = append(keys, strconv.FormatInt(o.ID, 10)) // still worth a try
		default:
			st.Aborted++
			w.log.WarnContext(ctx, "order watchdog: saga aborted, nothing was charged; the order will be REJECTED",
				"order", o.ID, "saga", SagaID(o.ID), "created_at", FormatTime(o.CreatedAt))
		}
	}
	if len(keys) == 0 {
		return st, nil
	}
	n, err := outbox.Redrive(ctx, w.drv, outbox.RedriveOptions{Keys: keys})
	st.Stuck, st.Redriven = len(keys)-st.Operator, n
	if err != nil {
		return st, err
	}
	w.log.WarnContext(ctx, "order watchdog: orders not moving, their events published again",
		"orders", len(keys), "events", n, "stuck_after", w.cfg.StuckAfter.String())
	return st, nil
}

// GiveUp aborts the saga of order id unless it charged a payment, in one
// transaction: it starts the saga if no event ever did, records its
// place-order step, and claims its charge-payment step as declined, so
// that a late OrderCreated.v1 finds the step taken and charges nothing;
// then RunCompensator REJECTs the order. charged is true, and nothing is
// changed, when the charge step had charged a payment (or the saga is not
// running: it moved on).
func (w *Watchdog[TTx]) GiveUp(ctx context.Context, id int64) (charged bool, err error) {
	tx, err := w.drv.Begin(ctx)
	if err != nil {
		return false, err
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
		return false, err
	}
	if s.State != saga.Running {
		return s.State != saga.Compensating && s.State != saga.Compensated, nil
	}
	if _, _, err := w.ps.sagas.StepTx(ctx, tx, sagaID, StepPlace, func(context.Context, TTx) ([]byte, error) {
		return []byte(strconv.FormatInt(id, 10)), nil
	}); err != nil {
		return false, err
	}
	res, _, err := w.ps.sagas.StepTx(ctx, tx, sagaID, StepCharge, func(context.Context, TTx) ([]byte, error) {
		return []byte(DeclinedPrefix + "saga stuck, given up by the watchdog"), nil
	})
	if err != nil {
		return false, err
	}
	if !strings.HasPrefix(string(res), DeclinedPrefix) {
		return true, nil
	}
	if err := w.ps.sagas.AbortTx(ctx, tx, sagaID); err != nil && !errors.Is(err, saga.ErrState) {
		return false, err
	}
	if err := w.drv.Commit(ctx, tx); err != nil {
		return false, err
	}
	commit = true
	return false, nil
}
