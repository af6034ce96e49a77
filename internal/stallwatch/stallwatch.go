// Package stallwatch measures how long the test process did not run: on a
// loaded machine (CI's two cores, busy with the rest of the suite) a
// process may get no CPU for seconds at a time, and a test that bounds
// how long something took must not count those seconds against the code
// under test.
//
// A Watch ticks every Tick and adds up the lateness of the ticks that came
// more than Slack late: the time nothing of the process ran. A test adds
// Stalled to the bound it checks, which stays as strict as written on a
// machine that keeps up.
package stallwatch

import (
	"sync"
	"sync/atomic"
	"time"
)

const (
	// Tick is how often a Watch looks at the clock.
	Tick = 10 * time.Millisecond
	// Slack is how late a tick may come without counting as a stall.
	Slack = 50 * time.Millisecond
)

// Watch is a running measurement of the process's stalls.
type Watch struct {
	stalled atomic.Int64
	once    sync.Once
	stop    chan struct{}
	done    chan struct{}
}

// Start starts a Watch. Stop ends its goroutine (StartFor stops it when
// its test ends).
func Start() *Watch {
	w := &Watch{stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// Cleanup is what testing.TB.Cleanup needs.
type Cleanup interface{ Cleanup(func()) }

// StartFor starts a Watch stopped when t ends.
func StartFor(t Cleanup) *Watch {
	w := Start()
	t.Cleanup(func() { w.Stop() })
	return w
}

func (w *Watch) run() {
	defer close(w.done)
	ticker := time.NewTicker(Tick)
	defer ticker.Stop()
	last := time.Now()
	for {
		select {
		case <-w.stop:
			return
		case <-ticker.C:
		}
		now := time.Now()
		if late := now.Sub(last) - Tick; late > Slack {
			w.stalled.Add(int64(late))
		}
		last = now
	}
}

// Stalled is how long the process stalled since Start.
func (w *Watch) Stalled() time.Duration { return time.Duration(w.stalled.Load()) }

// Since is how long the process stalled since an earlier reading of
// Stalled.
func (w *Watch) Since(before time.Duration) time.Duration { return w.Stalled() - before }

// Stop ends the Watch and returns Stalled. It may be called more than
// once.
func (w *Watch) Stop() time.Duration {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	return w.Stalled()
}
