// Package dbclock corrects the host's clock by the database's: the default
// clock of the components whose times are compared across replicas
// (idemhttp's ModeLease leases and record expiry, cleanup's lease and
// cut-offs). Replicas whose hosts disagree (a VM resumed from suspend, a
// broken NTP daemon) then still agree on the database's time.
package dbclock

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver"
)

const (
	// Every is how often Sync measures the offset again.
	Every = 10 * time.Second
	// WarnAbove is the offset from which the host's clock is reported
	// (Warn), and the change of it that is reported again.
	WarnAbove = time.Second
	// maxRoundTrip is the longest measurement kept: the offset is known
	// to within half of it.
	maxRoundTrip = time.Second
	// measureTimeout bounds one measurement.
	measureTimeout = maxRoundTrip
)

// base is the origin of Clock.next (its monotonic reading).
var base = time.Now()

// Clock is the host's clock plus the last measured offset to the
// database's. The zero offset (never measured, or no driver.Clock) is the
// host's clock as is.
type Clock struct {
	src       driver.Clock
	wall      func() time.Time
	logger    *slog.Logger
	component string

	offset atomic.Int64 // database minus host, nanoseconds
	// next is when to measure again, in monotonic nanoseconds since
	// base. hostAt and monoAt are the host's clock (unix nanoseconds) and
	// the monotonic one (since base) at the last measurement: when the
	// host's clock has since moved more or less than the monotonic one
	// (NTP stepped it, a VM resumed), the offset is stale and Sync
	// measures at once.
	next, hostAt, monoAt atomic.Int64

	measured atomic.Bool // an offset was measured (kept) once

	mu     sync.Mutex // one measurement at a time
	warned time.Duration
}

// New returns the clock of component (a log prefix), corrected by the
// database's clock of drv if drv is a driver.Clock.
func New(drv any, logger *slog.Logger, component string) *Clock {
	c := &Clock{wall: time.Now, logger: logger, component: component}
	c.src, _ = drv.(driver.Clock)
	return c
}

// SetHostClock replaces the host's clock (tests: a host whose clock is
// off) and measures again at the next Sync.
func (c *Clock) SetHostClock(wall func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = wall
	c.next.Store(0)
	c.measured.Store(false)
}

// Offset is the last measured offset of the database's clock to the
// host's.
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Now is the host's time corrected by the last measured offset.
func (c *Clock) Now() time.Time {
	return c.wall().Add(time.Duration(c.offset.Load()))
}

// Sync measures the offset again if the last measurement is older than
// Every, or if the host's clock was stepped since (it moved more than
// maxStep away from the monotonic clock): one SELECT of the database's
// clock every Every at most while the host's clock runs smoothly, the
// other calls cost two clock reads and a few atomic loads. A failed measurement keeps the last
// offset (the database is likely unreachable, and what the caller does
// next fails too). Only one caller measures at a time; the others go on
// with the last offset.
func (c *Clock) Sync(ctx context.Context) {
	if c == nil || c.src == nil {
		return
	}
	mono := int64(time.Since(base))
	if mono < c.next.Load() && !c.stepped(mono) {
		return
	}
	if !c.mu.TryLock() {
		return
	}
	defer c.mu.Unlock()
	c.measure(ctx)
}

// Measured reports whether the offset was measured once (the database's
// clock read within maxRoundTrip), or needs none (no driver.Clock: the
// host's clock is the database's). Until then Now is the host's clock as
// is, which a caller that compares times written by other hosts (a
// lease) must not trust.
func (c *Clock) Measured() bool {
	return c == nil || c.src == nil || c.measured.Load()
}

// Measure measures the offset now, whatever Sync's schedule, waiting for
// a measurement in progress, and returns Measured. For a caller that
// needs the database's time once (before taking a lease), not for every
// request: Sync is the cheap one.
func (c *Clock) Measure(ctx context.Context) bool {
	if c == nil || c.src == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.measure(ctx)
	return c.Measured()
}

// measure reads the database's clock and keeps the offset if the reading
// was quick enough; c.mu is held.
func (c *Clock) measure(ctx context.Context) {
	wall := c.wall
	mctx, cancel := context.WithTimeout(ctx, measureTimeout)
	defer cancel()
	t1 := wall()
	db, err := c.src.DatabaseNow(mctx)
	t2 := wall()
	c.next.Store(int64(time.Since(base) + Every))
	c.hostAt.Store(t2.UnixNano())
	c.monoAt.Store(int64(time.Since(base)))
	if err != nil {
		c.logger.Debug(c.component+": could not read the database's clock; keeping the last offset", "err", err, "offset", c.Offset())
		return
	}
	rtt := t2.Sub(t1)
	if rtt > maxRoundTrip {
		return // too slow to tell
	}
	off := db.Sub(t1.Add(rtt / 2))
	c.offset.Store(int64(off))
	c.measured.Store(true)
	switch {
	case abs(off) > WarnAbove && abs(off-c.warned) > WarnAbove:
		c.warned = off
		c.logger.Warn(c.component+": this host's clock disagrees with the database's; leases and expiry use the database's clock. Fix the host's time synchronisation (NTP)",
			"host_clock_ahead", (-off).Round(time.Millisecond))
	case abs(off) <= WarnAbove && c.warned != 0:
		c.warned = 0
		c.logger.Info(c.component+": this host's clock agrees with the database's again", "host_clock_ahead", (-off).Round(time.Millisecond))
	}
}

// maxStep is how far the host's clock may move from the monotonic one
// between two measurements before the offset is taken for stale.
const maxStep = 100 * time.Millisecond

// stepped reports whether the host's clock moved more than maxStep away
// from the monotonic clock (mono, since base) since the last measurement.
func (c *Clock) stepped(mono int64) bool {
	host := c.wall().UnixNano() - c.hostAt.Load()
	return abs(time.Duration(host-(mono-c.monoAt.Load()))) > maxStep
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
