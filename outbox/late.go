package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
)

// LatePublisher is a Publisher that may learn the outcome of an event after
// Publish returned it failed: idemkafka.Publisher reports the events of a
// partition that does not answer as failed with an unknown outcome
// (idemkafka.ErrOutcomeUnknown) while its client keeps their records, and
// learns later whether the broker wrote them. A relay whose publisher
// implements it calls PublishLate instead of Publish, and uses what late
// tells it:
//
//   - late(i, nil): event i is published after all (the broker durably
//     accepted it). The relay marks it published, at most once and as a
//     round would (a row already published keeps its first time), instead
//     of publishing it again after its backoff; the key's next event is then
//     claimable at once.
//   - late(i, err): event i is not published. If it is the head of its key
//     (see driver.OutboxExecutor), the relay makes it due at once (an
//     attempt is counted, err is its last_error) instead of waiting out its
//     backoff.
//
// Only events whose entry in PublishLate's result was not nil may be
// reported, each at most once, from any goroutine, at any time (also
// before PublishLate returns); late must not be called for an event the
// publisher did not send. The order of a key still holds: report an event
// published only if every earlier event of its key in the call is
// published (in the result, or reported so before). The relay checks it
// too: it marks an event published only once the earlier events of its key
// in the round are marked, and never before the round's own marks are
// committed (a round whose marks fail drops its late outcomes: its events
// are claimed again). late does not block.
//
// Without it (a Publisher of Publish only), such events are published
// again at their next retry, and their keys wait for it; so does a
// wrapper around a LatePublisher (a PublisherFunc that counts, say) unless
// it implements PublishLate too and passes late on. Outcomes learned
// while the relay is stopped (after Run returned) wait for its next Run or
// RunOnce, and are lost with the relay.
type LatePublisher interface {
	Publisher
	PublishLate(ctx context.Context, events []event.Envelope, late func(i int, err error)) error
}

// lateRetry is how soon late outcomes are applied again after their
// transaction failed (the database).
const lateRetry = time.Second

// lateQueue holds the late outcomes a relay learned and has not applied.
type lateQueue struct {
	mu      sync.Mutex
	entries []lateEntry
	signal  chan struct{} // cap 1: entries to look at
}

// lateEntry is one late outcome: event i of round lr.
type lateEntry struct {
	lr  *lateRound
	i   int
	err error
}

// lateRound is what a round's late outcomes need: its rows and events
// (aligned with the events given to PublishLate), and, once its marks
// committed, which events are published.
type lateRound struct {
	q      *lateQueue
	rows   []driver.OutboxRow
	events []event.Envelope
	// state, guarded by q.mu: the round is marking (late outcomes wait),
	// committed, or dropped (its marks failed: its outcomes are discarded).
	state lateState
	outs  []error // the round's outcomes, once committed (guarded by q.mu)
	// published is, per event, whether it is marked published (by the
	// round or late); made from outs by the applier, which alone uses it.
	published []bool
}

type lateState uint8

const (
	lateMarking lateState = iota
	lateCommitted
	lateDropped
)

func (q *lateQueue) wake() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// report is the late callback given to PublishLate.
func (lr *lateRound) report(i int, err error) {
	q := lr.q
	q.mu.Lock()
	if i < 0 || i >= len(lr.rows) || lr.state == lateDropped {
		q.mu.Unlock()
		return
	}
	q.entries = append(q.entries, lateEntry{lr: lr, i: i, err: err})
	ready := lr.state == lateCommitted
	q.mu.Unlock()
	if ready {
		q.wake()
	}
}

// settle ends the round's marking: committed (outs are the outcomes its
// marks recorded, nil for a published event) or not (its late outcomes are
// dropped).
func (lr *lateRound) settle(committed bool, outs []error) {
	q := lr.q
	q.mu.Lock()
	if committed {
		lr.state, lr.outs = lateCommitted, outs
	} else {
		lr.state = lateDropped
	}
	pending := len(q.entries) > 0
	q.mu.Unlock()
	if pending {
		q.wake()
	}
}

// headOf reports whether every earlier event of event i's key in the round
// is published (marked by the round, or late).
func (lr *lateRound) headOf(i int) bool {
	key := lr.rows[i].Key
	for j := range i {
		if lr.rows[j].Key == key && !lr.published[j] {
			return false
		}
	}
	return true
}

// take removes from the queue the entries of rounds that are no longer
// marking, and returns those of committed rounds.
func (q *lateQueue) take() []lateEntry {
	q.mu.Lock()
	defer q.mu.Unlock()
	var (
		ready []lateEntry
		kept  = q.entries[:0]
	)
	for _, e := range q.entries {
		switch e.lr.state {
		case lateMarking:
			kept = append(kept, e)
		case lateCommitted:
			ready = append(ready, e)
		}
	}
	clear(q.entries[len(kept):])
	q.entries = kept
	return ready
}

// putBack returns entries to the queue (their transaction failed).
func (q *lateQueue) putBack(es []lateEntry) {
	q.mu.Lock()
	q.entries = append(es, q.entries...)
	q.mu.Unlock()
}

// applyLate applies the late outcomes of committed rounds: the events
// published after all are marked published, the heads whose record failed
// are made due now, in one transaction. It reports whether it changed
// anything a claim could see. On a failed transaction the outcomes are
// kept for the next call.
func (r *Relay[TTx]) applyLate(ctx context.Context) (bool, error) {
	r.lateMu.Lock()
	defer r.lateMu.Unlock()
	es := r.late.take()
	if len(es) == 0 {
		return false, nil
	}
	var (
		ids      []int64
		evs      []event.Envelope
		failed   []lateEntry
		newlyPub []lateEntry
		ignored  int
	)
	for _, e := range es {
		lr := e.lr
		if lr.published == nil {
			lr.published = make([]bool, len(lr.rows))
			for i, err := range lr.outs {
				lr.published[i] = err == nil
			}
		}
		if lr.published[e.i] {
			continue // published by the round, or reported twice
		}
		if !lr.headOf(e.i) {
			// An earlier event of its key is not known published: marking
			// this one would let the key's order slip (not seen with
			// idemkafka, whose records of a key resolve in order). It is
			// published again after its head. A failure behind a head is
			// the head's (kgo fails the records after a failed one).
			if e.err == nil {
				ignored++
			}
			continue
		}
		if e.err != nil {
			failed = append(failed, e)
			continue
		}
		lr.published[e.i] = true // the later events of its key may follow
		newlyPub = append(newlyPub, e)
		ids = append(ids, lr.rows[e.i].ID)
		evs = append(evs, lr.events[e.i])
	}
	undo := func() {
		for _, e := range newlyPub {
			e.lr.published[e.i] = false
		}
	}
	if len(ids) == 0 && len(failed) == 0 {
		if ignored > 0 {
			r.cfg.Logger.Warn("outbox: late outcomes ignored: an earlier event of their key is not known published; they are published again after it",
				"events", ignored)
		}
		return false, nil
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	err := r.markLate(fctx, ids, failed)
	if err != nil {
		undo()
		r.late.putBack(es)
		return false, err
	}
	if len(evs) > 0 && r.cfg.OnPublished != nil {
		r.cfg.OnPublished(evs)
	}
	args := []any{"published", len(ids), "retried_now", len(failed)}
	if len(failed) > 0 {
		args = append(args, "first_err", failed[0].err)
	}
	if ignored > 0 {
		args = append(args, "ignored", ignored)
	}
	r.cfg.Logger.Info("outbox: outcomes learned after publish gave up on them applied; their keys go on at once", args...)
	return true, nil
}

// markLate marks rows ids published and the rows of failed due now (see
// applyLate), in one transaction. It waits for this relay's rounds under
// way and holds new ones back meanwhile (lateGate): a round's transaction
// locks the rows it marks in another order, and a late outcome's rows are
// often in one (claimed again once their backoff passed), so running both
// at once deadlocked (PostgreSQL aborted one of them after
// deadlock_timeout; seen in the end-to-end Kafka outage test).
func (r *Relay[TTx]) markLate(ctx context.Context, ids []int64, failed []lateEntry) (err error) {
	r.lateGate.Lock()
	defer r.lateGate.Unlock()
	tx, err := r.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox: begin: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = r.drv.Rollback(ctx, tx)
		}
	}()
	ex := r.drv.OutboxTx(tx)
	now := r.cfg.Now()
	if len(ids) > 0 {
		if err := ex.OutboxMarkPublished(ctx, &driver.OutboxMarkPublishedParams{IDs: ids, At: now}); err != nil {
			return fmt.Errorf("outbox: mark %d events published late: %w", len(ids), err)
		}
	}
	for _, f := range failed {
		row := f.lr.rows[f.i]
		err := ex.OutboxMarkFailed(ctx, &driver.OutboxMarkFailedParams{ID: row.ID, Error: storedError(f.err), NextAttempt: now})
		if err != nil && !errors.Is(err, driver.ErrNotFound) { // published meanwhile
			return fmt.Errorf("outbox: retry event %s now: %w", row.EventID, err)
		}
	}
	if err := r.drv.Commit(ctx, tx); err != nil {
		return fmt.Errorf("outbox: commit late outcomes: %w", err)
	}
	done = true
	return nil
}

// runLate applies late outcomes as they come until ctx ends, and signals
// wake after each application that made events claimable.
func (r *Relay[TTx]) runLate(ctx context.Context, wake chan<- struct{}) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.late.signal:
		case <-retry:
		}
		retry = nil
		changed, err := r.applyLate(ctx)
		if err != nil {
			r.cfg.Logger.Warn("outbox: could not apply outcomes learned after publish gave up on them; trying again, their events are retried at their backoff meanwhile",
				"err", err, "retry_in", lateRetry)
			retry = time.After(lateRetry)
		}
		if changed {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}
