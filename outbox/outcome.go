package outbox

import (
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

// logFailures logs one warning for the events backed off by a round and one
// error per parked event, and calls OnPark.
func (r *Relay[TTx]) logFailures(s sorted) {
	var retried []failedRow
	for _, f := range s.failed {
		if !f.park {
			retried = append(retried, f)
			continue
		}
		r.cfg.Logger.Error("outbox: event parked as poison; the later events of its key wait until it is unparked",
			"event_id", f.row.EventID, "key", f.row.Key, "type", f.row.EventType,
			"attempts", f.row.Attempts, "err", f.err)
		if r.cfg.OnPark != nil {
			e, _ := toEnvelope(f.row)
			r.cfg.OnPark(e, f.row.Attempts, f.err)
		}
	}
	if len(retried) > 0 {
		f := retried[0]
		r.cfg.Logger.Warn("outbox: publish failed; the failed events and the later events of their keys wait for a retry",
			"failed", len(retried), "skipped", s.skipped, "published", len(s.published),
			"first_event_id", f.row.EventID, "first_key", f.row.Key, "first_attempt", f.row.Attempts,
			"first_retry_in", f.retryIn, "err", f.err)
	}
}
