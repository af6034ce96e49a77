// Package stallmeter measures how long the test process stood still: on a
// loaded CI machine (2 cores, other test binaries running) the whole
// process is sometimes not scheduled for seconds, and a test that bounds
// an elapsed time (a shutdown within its timeout, a wait that must end
// early) then fails although the code under test did nothing wrong.
//
// A Meter runs a goroutine that wakes every Tick; whatever its wake-ups
// come later than Threshold is counted as a stall. Elapsed is the time
// since Start less those stalls: the time the code under test took while
// the process ran. A code path that waits (a timer, a fetch, a lock) does
// not stall the meter, so a bound on Elapsed still catches it; a wait that
// a stall overlapped counts short by that stall (its timer ran on
// meanwhile): a run whose process stalled is lenient, the runs without
// stalls are exact.
package stallmeter

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// Tick is how often the meter's goroutine wakes.
	Tick = 10 * time.Millisecond
	// Threshold is the lateness of a wake-up below which it is the
	// scheduler's ordinary delay, not a stall.
	Threshold = 50 * time.Millisecond
)

// Meter measures the process's stalls from Start until Stop.
type Meter struct {
	start    time.Time
	stalled  atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// Start starts a Meter, and the time its Elapsed measures; t's Cleanup
// stops it.
func Start(t testing.TB) *Meter {
	m := &Meter{stop: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(m.done)
		tk := time.NewTicker(Tick)
		defer tk.Stop()
		last := time.Now()
		close(ready)
		for {
			select {
			case <-m.stop:
				return
			case <-tk.C:
			}
			now := time.Now()
			m.stalled.Add(int64(Stall(now.Sub(last))))
			last = now
		}
	}()
	<-ready
	m.start = time.Now()
	t.Cleanup(func() { m.Stop() })
	return m
}

// Stall is what of gap, the time between two wake-ups of the meter, counts
// as a stall: the lateness beyond Tick when it exceeds Threshold, else 0.
func Stall(gap time.Duration) time.Duration {
	if late := gap - Tick; late > Threshold {
		return late
	}
	return 0
}

// Elapsed returns the time since Start less the stalls measured since
// (ran: the time the process ran), and those stalls. Call it once the
// measured operation ended, as time.Since.
func (m *Meter) Elapsed() (ran, stalled time.Duration) {
	// Let the meter wake up once more, so that a stall that ended just
	// now is counted.
	end := time.Now()
	time.Sleep(3 * Tick)
	stalled = time.Duration(m.stalled.Load())
	return max(end.Sub(m.start)-stalled, 0), stalled
}

// Stalled returns the stalls measured so far: a test adds them to a bound
// on an elapsed time it reads itself.
func (m *Meter) Stalled() time.Duration { return time.Duration(m.stalled.Load()) }

// Stop stops the meter's goroutine and returns the stalls it measured. It
// may be called more than once.
func (m *Meter) Stop() time.Duration {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
	return m.Stalled()
}
