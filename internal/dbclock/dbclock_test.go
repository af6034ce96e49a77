package dbclock

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDB is a database whose clock is the host's plus off; delay slows
// its answer, err fails it.
type fakeDB struct {
	off   time.Duration
	delay time.Duration
	err   error
	reads atomic.Int64
}

func (f *fakeDB) DatabaseNow(context.Context) (time.Time, error) {
	f.reads.Add(1)
	time.Sleep(f.delay)
	if f.err != nil {
		return time.Time{}, f.err
	}
	return time.Now().Add(f.off), nil
}

func near(got, want time.Duration) bool { return (got - want).Abs() < 100*time.Millisecond }

func TestSync(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	db := &fakeDB{off: -2 * time.Hour} // the host runs 2h ahead
	c := New(db, slog.New(slog.NewTextHandler(&logs, nil)), "test")
	if got := c.Now(); !near(time.Until(got), 0) {
		t.Fatalf("before the first Sync Now is %s off the host's; want the host's", time.Until(got))
	}
	c.Sync(t.Context())
	if got := time.Until(c.Now()); !near(got, -2*time.Hour) {
		t.Fatalf("after Sync Now is %s off the host's; want -2h", got)
	}
	if !strings.Contains(logs.String(), "clock disagrees with the database's") || !strings.Contains(logs.String(), "host_clock_ahead=") {
		t.Errorf("no warning of the host 2h ahead: %s", logs.String())
	}

	// Within Every, no other read.
	for range 100 {
		c.Sync(t.Context())
	}
	if n := db.reads.Load(); n != 1 {
		t.Fatalf("%d reads of the database's clock for 101 Syncs within %s; want 1", n, Every)
	}

	// A failed read keeps the offset; a slow one is not used.
	c.next.Store(0)
	db.err = errors.New("connection refused")
	c.Sync(t.Context())
	if got := c.Offset(); !near(got, -2*time.Hour) {
		t.Fatalf("after a failed read the offset is %s; want the last one, -2h", got)
	}
	c.next.Store(0)
	db.err, db.off, db.delay = nil, 0, maxRoundTrip+100*time.Millisecond
	c.Sync(t.Context())
	if got := c.Offset(); !near(got, -2*time.Hour) {
		t.Fatalf("after a read slower than %s the offset is %s; want the last one, -2h", maxRoundTrip, got)
	}

	// The host is fixed: the offset follows, and the operator hears of it.
	c.next.Store(0)
	db.delay = 0
	c.Sync(t.Context())
	if got := c.Offset(); !near(got, 0) {
		t.Fatalf("offset %s once the clocks agree; want 0", got)
	}
	if !strings.Contains(logs.String(), "agrees with the database's again") {
		t.Errorf("no line when the clocks agree again: %s", logs.String())
	}
}

// Without a driver.Clock (or with no clock at all: nil) the host's clock
// is used as is.
func TestNoSource(t *testing.T) {
	t.Parallel()
	c := New(struct{}{}, slog.New(slog.DiscardHandler), "test")
	c.Sync(t.Context())
	if got := time.Until(c.Now()); !near(got, 0) {
		t.Fatalf("Now is %s off the host's; want 0", got)
	}
	var none *Clock
	none.Sync(t.Context()) // no panic
}

// A step of the host's clock (NTP correcting it after a VM resumed) makes
// the last offset wrong at once: the next Sync measures again, within
// Every.
func TestSyncAfterAStep(t *testing.T) {
	t.Parallel()
	var step atomic.Int64
	db := &fakeDB{}
	c := New(db, slog.New(slog.DiscardHandler), "test")
	c.SetHostClock(func() time.Time { return time.Now().Add(time.Duration(step.Load())) })
	c.Sync(t.Context())
	c.Sync(t.Context())
	if n := db.reads.Load(); n != 1 {
		t.Fatalf("%d reads before any step; want 1", n)
	}
	step.Store(int64(45 * time.Second))
	c.Sync(t.Context())
	if n := db.reads.Load(); n != 2 {
		t.Fatalf("%d reads after the host's clock stepped 45 s; want 2", n)
	}
	if got := time.Until(c.Now()); !near(got, 0) {
		t.Fatalf("after the step Now is %s off the database's; want 0", got)
	}
	c.Sync(t.Context())
	if n := db.reads.Load(); n != 2 {
		t.Fatalf("%d reads once the step was measured; want 2", n)
	}
}

// Measured says whether Now is corrected yet: not after failed readings
// (Sync then waits Every before it reads again), and Measure reads at once.
func TestMeasure(t *testing.T) {
	t.Parallel()
	db := &fakeDB{off: -time.Hour, err: errors.New("timeout")}
	c := New(db, slog.New(slog.DiscardHandler), "test")
	if c.Measured() {
		t.Fatal("Measured before any reading")
	}
	c.Sync(context.Background())
	if c.Measured() || c.Measure(context.Background()) || db.reads.Load() != 2 {
		t.Fatalf("after failed readings: Measured %v, %d reads; want false, 2", c.Measured(), db.reads.Load())
	}
	db.err = nil
	if !c.Measure(context.Background()) || !c.Measured() || !near(time.Until(c.Now()), -time.Hour) {
		t.Fatalf("after a reading: Measured %v, Now %s off the host's; want true, -1h", c.Measured(), time.Until(c.Now()))
	}
	if !New(nil, slog.New(slog.DiscardHandler), "test").Measured() {
		t.Error("a clock without a database's clock: not Measured; the host's clock is the database's")
	}
}
