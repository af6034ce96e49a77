package app

import (
	"log/slog"
	"time"
)

// failureLog logs a periodic measurement that fails: a WARN when the
// failures start, at most one every lagLogInterval while they last (with
// how many were not logged), and an INFO once one succeeds again. The
// messages and the name of the failure count's attribute are the
// caller's; attrs go on every line.
type failureLog struct {
	log *slog.Logger
	// recovered, failed and stillFailing are the three messages; countKey
	// names the attribute counting the failures.
	recovered, failed, stillFailing, countKey string
	attrs                                     []any

	// failingSince is when the failures started (zero while the
	// measurement succeeds); loggedAt when a failure was last logged,
	// suppressed the failures not logged since.
	failingSince, loggedAt time.Time
	failures, suppressed   int
}

// observe records one measurement's result.
func (l *failureLog) observe(err error) {
	now := time.Now()
	switch {
	case err == nil && !l.failingSince.IsZero():
		l.log.Info(l.recovered, append(l.attrs[:len(l.attrs):len(l.attrs)],
			l.countKey, l.failures, "since", l.failingSince, "over", now.Sub(l.failingSince).Round(time.Second).String())...)
		l.failingSince, l.failures, l.suppressed = time.Time{}, 0, 0
	case err == nil:
	case l.failingSince.IsZero():
		l.failingSince, l.loggedAt, l.failures = now, now, 1
		l.log.Warn(l.failed, append(l.attrs[:len(l.attrs):len(l.attrs)], "err", err)...)
	default:
		l.failures++
		if now.Sub(l.loggedAt) < lagLogInterval {
			l.suppressed++
			return
		}
		l.log.Warn(l.stillFailing+"; repeats are logged at most every "+lagLogInterval.String(),
			append(l.attrs[:len(l.attrs):len(l.attrs)], "err", err, "suppressed", l.suppressed, l.countKey, l.failures, "since", l.failingSince)...)
		l.loggedAt, l.suppressed = now, 0
	}
}
