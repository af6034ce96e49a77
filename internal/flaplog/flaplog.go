// Package flaplog limits the log lines of a failure that comes and goes: a
// database short of connections fails some operations and not others, and
// a component that logged each failure and each success after one logged
// two lines per flip, hundreds a minute.
//
// A Limiter says to log one line when the failures start, a summary at most
// every Interval while they go on (with the failures and the successes
// counted since the start), and one line when they have ended: a success
// after Quiet without a failure. A success while no failure is open costs
// an atomic load.
package flaplog

import (
	"sync"
	"sync/atomic"
	"time"
)

// Interval is the default of Limiter.Interval.
const Interval = 30 * time.Second

// Quiet is the default of Limiter.Quiet.
const Quiet = 10 * time.Second

// Action is what to log for a failure or a success.
type Action int

const (
	// None: nothing (a failure within Interval of the last line, a
	// success while no failure is open or before Quiet).
	None Action = iota
	// Start: the first failure of an episode.
	Start
	// Summary: a failure Interval or more after the episode's last line.
	Summary
	// End: a success Quiet or more after the episode's last failure.
	End
)

// Episode counts the failures and successes from an episode's first
// failure.
type Episode struct {
	First, Last time.Time // the first and the latest failure
	Failures    int       // failures since First
	Successes   int       // successes since First
	Suppressed  int       // failures not logged since the last line
}

// Limiter limits the lines of one failure that comes and goes. Its zero
// value uses Interval and Quiet. It is safe for concurrent use.
type Limiter struct {
	Interval time.Duration // 0: Interval
	Quiet    time.Duration // 0: Quiet

	open   atomic.Bool
	mu     sync.Mutex
	ep     Episode
	logged time.Time
}

// Open reports whether a failure is open: a success needs recording
// (Succeeded) only then. It is an atomic load.
func (l *Limiter) Open() bool { return l.open.Load() }

// Failed records a failure at now and says what to log: Start, Summary
// (with the episode so far; Suppressed counts the failures not logged
// before this one) or None.
func (l *Limiter) Failed(now time.Time) (Action, Episode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open.Load() {
		l.ep = Episode{First: now, Last: now, Failures: 1}
		l.logged = now
		l.open.Store(true)
		return Start, l.ep
	}
	l.ep.Failures++
	if now.After(l.ep.Last) {
		l.ep.Last = now
	}
	interval := l.Interval
	if interval <= 0 {
		interval = Interval
	}
	if now.Sub(l.logged) < interval {
		l.ep.Suppressed++
		return None, Episode{}
	}
	out := l.ep
	l.logged, l.ep.Suppressed = now, 0
	return Summary, out
}

// Succeeded records a success at now and says what to log: End (with the
// episode, which it closes) when no failure came for Quiet, else None.
func (l *Limiter) Succeeded(now time.Time) (Action, Episode) {
	if !l.open.Load() {
		return None, Episode{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open.Load() {
		return None, Episode{}
	}
	l.ep.Successes++
	quiet := l.Quiet
	if quiet <= 0 {
		quiet = Quiet
	}
	if now.Sub(l.ep.Last) < quiet {
		return None, Episode{}
	}
	l.open.Store(false)
	return End, l.ep
}
