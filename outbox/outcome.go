package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
)

// failedRow is an event whose attempt failed in this round.
type failedRow struct {
	row     driver.OutboxRow
	err     error
	park    bool
	retryIn time.Duration
	// gone: its park found no pending row (published meanwhile by a late
	// outcome): nothing was parked, nothing to log or report.
	gone bool
}

// sorted is what a round learned from Publish.
type sorted struct {
	published []int64          // row IDs to mark published
	events    []event.Envelope // their events, for OnPublished
	failed    []failedRow      // heads of keys whose attempt failed
	skipped   int              // events not tried; retried without counting
	// disordered counts events reported published after an earlier event of
	// their key failed (a publisher bug).
	disordered int
	firstErr   error
	// recovered holds the last_error of the published events that had
	// failed before (see failureLog.ended).
	recovered []string
}

// sortOutcomes decides, per event, what the round records. Published events
// are marked. For each key, the first event that is not published is the
// key's head from now on: if its attempt failed it counts (backed off, or
// parked if poison or out of attempts); the key's later events are left as
// they are, blocked by their head. An interrupted round (ctx done) counts no
// failure: a shutdown is not the events' fault.
func (r *Relay[TTx]) sortOutcomes(rows []driver.OutboxRow, events []event.Envelope, outs []error, interrupted bool) sorted {
	var (
		s       sorted
		stopped map[string]bool
	)
	for i, row := range rows {
		err := outs[i]
		if err == nil {
			if stopped[row.Key] {
				s.disordered++
			}
			s.published = append(s.published, row.ID)
			s.events = append(s.events, events[i])
			if row.Attempts > 0 && row.LastError != "" {
				s.recovered = append(s.recovered, row.LastError)
			}
			continue
		}
		if s.firstErr == nil && !errors.Is(err, ErrSkipped) {
			// A skipped event (the publisher left it for the next round,
			// e.g. a key whose events change topic) is no failure.
			s.firstErr = err
		}
		if stopped[row.Key] {
			continue
		}
		if stopped == nil {
			stopped = map[string]bool{}
		}
		stopped[row.Key] = true
		if interrupted || errors.Is(err, ErrSkipped) {
			s.skipped++
			continue
		}
		attempts := row.Attempts + 1
		park := errors.Is(err, ErrPoison) || (r.cfg.MaxAttempts > 0 && attempts >= r.cfg.MaxAttempts)
		s.failed = append(s.failed, failedRow{row: row, err: err, park: park})
	}
	return s
}

// logFailures logs one error per parked event and calls OnPark, and logs
// the events backed off by a round through r.failures: a warning when a
// failure (grouped by error text, see failureLog) is first seen, a summary
// of its repeats at most every failureLogInterval, and a line when an event
// that failed with it is published (or it has not been seen for
// failureQuietAfter).
func (r *Relay[TTx]) logFailures(ctx context.Context, s sorted) {
	var retried []failedRow
	for _, f := range s.failed {
		if f.gone {
			continue
		}
		if !f.park {
			retried = append(retried, f)
			continue
		}
		r.cfg.Logger.ErrorContext(ctx, "outbox: event parked as poison; the later events of its key wait until it is unparked",
			"event_id", f.row.EventID, "key", f.row.Key, "type", f.row.EventType,
			"attempts", f.row.Attempts, "err", f.err)
		if r.cfg.OnPark != nil {
			e, _ := toEnvelope(f.row)
			r.cfg.OnPark(e, f.row.Attempts, f.err)
		}
	}
	now := r.cfg.Now()
	r.logQuiet(now) // before this round's failures: one not seen for long is new
	var (
		failedNow map[string]bool
		order     []string
		byClass   map[string][]failedRow
	)
	for _, f := range retried {
		if failedNow == nil {
			failedNow, byClass = map[string]bool{}, map[string][]failedRow{}
		}
		key := failureClass(storedError(f.err))
		if !failedNow[key] {
			failedNow[key] = true
			order = append(order, key)
		}
		byClass[key] = append(byClass[key], f)
	}
	for _, key := range order {
		fs := byClass[key]
		f := fs[0]
		log, g := r.failures.failed(storedError(f.err), now)
		switch {
		case !log:
		case g.rounds == 1:
			r.cfg.Logger.WarnContext(ctx, "outbox: publish failed; the failed events and the later events of their keys wait for a retry",
				"failed", len(fs), "skipped", s.skipped, "published", len(s.published),
				"first_event_id", f.row.EventID, "first_key", f.row.Key, "first_attempt", f.row.Attempts,
				"first_retry_in", f.retryIn, "err", f.err)
		default:
			r.cfg.Logger.WarnContext(ctx, "outbox: publish still failing; repeats of a failure are logged at most every "+failureLogInterval.String(),
				"suppressed", g.suppressed, "failed_rounds", g.rounds, "since", g.first,
				"failed", len(fs), "first_event_id", f.row.EventID, "first_key", f.row.Key, "first_attempt", f.row.Attempts,
				"first_retry_in", f.retryIn, "err", f.err)
		}
	}
	for _, g := range r.failures.published(s.recovered, failedNow) {
		r.cfg.Logger.InfoContext(ctx, "outbox: published again after failed rounds",
			"failed_rounds", g.rounds, "over", now.Sub(g.first), "since", g.first, "err", g.err)
	}
}

// logQuiet logs the publish failures forgotten at now (see
// failureLog.quiet).
func (r *Relay[TTx]) logQuiet(now time.Time) {
	for _, g := range r.failures.quiet(now) {
		r.cfg.Logger.Info("outbox: publish failure no longer seen; its events were published by another relay, failed otherwise, were parked or removed",
			"failed_rounds", g.rounds, "over", g.last.Sub(g.first), "since", g.first, "last_failed_at", g.last, "err", g.err)
	}
}
