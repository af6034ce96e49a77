package app

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/dbclock"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// A second idemd with the embedded broker on a PostgreSQL database that an
// idemd already serves refuses to start, also when its host's clock runs
// ahead (here 30 s, more than the 10 s of lease a renewal leaves): it
// must not take over the live lease (the running idemd would stop at its
// next renewal). It waits for the lease to lapse (one lease length), then
// refuses. The hosts' clocks are replaced per lease holder
// (dbclock.Clock.SetHostClock); the system clock is not touched.
//
// Also when its first reading of the database's clock fails (a loaded
// database, a round trip over dbclock's 1 s): it took the live lease at
// once, on its host's clock alone, 30 s ahead.
func TestEmbeddedLeaseNotTakenByAHostAhead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fails int32 // the second idemd's first readings of the database's clock that fail
	}{{"clock read", 0}, {"first clock reading failed", 1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			leaseNotTakenByAHostAhead(t, c.fails)
		})
	}
}

// failingClock is the database's clock whose first fails readings fail.
type failingClock struct {
	src   driver.Clock
	fails atomic.Int32
}

func (c *failingClock) DatabaseNow(ctx context.Context) (time.Time, error) {
	if c.fails.Add(-1) >= 0 {
		return time.Time{}, errors.New("timeout: context deadline exceeded")
	}
	return c.src.DatabaseNow(ctx)
}

func leaseNotTakenByAHostAhead(t *testing.T, fails int32) {
	drv := testdb.Postgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), embeddedLockTTL+30*time.Second)
	defer cancel()
	// The running idemd is on another host (its owner names it), on a
	// correct clock, and renews its lease every 5 s.
	running := &App{log: slog.New(slog.DiscardHandler), fatal: make(chan error, 1)}
	ex := drv.Executor()
	ls := &lease{name: EmbeddedLock, owner: "other-host/4242/0badf00d/pid_[1]", ex: ex,
		clock: dbclock.New(drv, running.log, "embedded broker"), done: make(chan struct{})}
	now := time.Now()
	if ok, err := ex.LockAcquire(ctx, &driver.LockAcquireParams{Name: ls.name, Owner: ls.owner, Now: now, Until: now.Add(embeddedLockTTL)}); err != nil || !ok {
		t.Fatalf("LockAcquire = %v, %v", ok, err)
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	ls.stop = stop
	go ls.renew(rctx, running)
	defer ls.release()

	var logs testlog.Buffer
	second := &App{log: slog.New(slog.NewTextHandler(&logs, nil)), fatal: make(chan error, 1)}
	src := &failingClock{src: drv}
	src.fails.Store(fails)
	ahead := dbclock.New(src, second.log, "embedded broker")
	ahead.SetHostClock(func() time.Time { return time.Now().Add(30 * time.Second) })
	got, err := acquireLease(ctx, second, drv.Executor(), ahead, EmbeddedLock)
	if err == nil {
		got.release()
		t.Fatalf("the idemd on a host 30 s ahead took the embedded-broker lease another idemd renews; want it refused. Logs:\n%s", logs.String())
	}
	var cerr *ConfigError
	if !errors.As(err, &cerr) {
		t.Fatalf("acquireLease = %v; want the ConfigError that another idemd runs the broker", err)
	}
	if !strings.Contains(logs.String(), "clock disagrees with the database's") {
		t.Errorf("no warning of the host 30 s ahead. Logs:\n%s", logs.String())
	}
	select {
	case err := <-running.fatal:
		t.Fatalf("the running idemd failed: %v", err)
	default:
	}
}

// offClock is a database whose clock is off the host's by off.
type offClock struct{ off time.Duration }

func (c offClock) DatabaseNow(context.Context) (time.Time, error) { return time.Now().Add(c.off), nil }

// The relay's fence into the embedded broker reads the lease's own clock
// (the host's corrected by the database's): with this host's clock an hour
// off the database's, either way, the lease this idemd just took holds and
// the relay publishes, and past the lease it does not. Read on the host's
// clock alone, a lease taken on the database's time looked lapsed an hour
// early (database behind: the relay never published) or live an hour past
// its end (database ahead: the fence never held anything back).
func TestFencedPublisherOnAHostOff(t *testing.T) {
	t.Parallel()
	for _, off := range []time.Duration{time.Hour, -time.Hour} {
		t.Run("database "+off.String(), func(t *testing.T) {
			t.Parallel()
			drv := testdb.Postgres(t)
			a := &App{log: slog.New(slog.DiscardHandler), fatal: make(chan error, 1)}
			clock := dbclock.New(offClock{off}, a.log, "embedded broker")
			l, err := acquireLease(t.Context(), a, drv.Executor(), clock, EmbeddedLock)
			if err != nil {
				t.Fatal(err)
			}
			defer l.release()
			e, err := event.New("Probe.v1", "k", map[string]int{"n": 1})
			if err != nil {
				t.Fatal(err)
			}
			inner := &fakeLate{}
			if err := newFencedPublisher(inner, l).Publish(t.Context(), []event.Envelope{e}); err != nil || inner.calls != 1 {
				t.Fatalf("Publish under a lease just taken, database %s off: err %v, %d publishes; want nil, 1", off, err, inner.calls)
			}
			// Past the lease's end, on its clock, nothing is published.
			l.validUntil.Store(clock.Now().Add(-time.Second).UnixNano())
			if err := newFencedPublisher(inner, l).Publish(t.Context(), []event.Envelope{e}); err == nil || inner.calls != 1 {
				t.Fatalf("Publish past the lease, database %s off: err %v, %d publishes; want skipped, still 1", off, err, inner.calls)
			}
		})
	}
}

// A fenced publisher that finds its lease not surely held (its renewals
// failed while the database was out) asks for a renewal at once: once the
// database answers, the relay's next round publishes, instead of skipping
// rounds until the renewal's next tick, up to 5 s later.
func TestFencedPublisherKicksARenewal(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	a := &App{log: slog.New(slog.DiscardHandler), fatal: make(chan error, 1)}
	l, err := acquireLease(t.Context(), a, drv.Executor(), dbclock.New(drv, a.log, "embedded broker"), EmbeddedLock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	e, err := event.New("Probe.v1", "k", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	inner := &fakeLate{}
	p := newFencedPublisher(inner, l)
	// As after renewals that failed: the lease has less than the guard
	// left by this process's account.
	l.validUntil.Store(l.clock.Now().Add(time.Second).UnixNano())
	if err := p.Publish(t.Context(), []event.Envelope{e}); err == nil || inner.calls != 0 {
		t.Fatalf("Publish with 1s of lease left: err %v, %d publishes; want skipped", err, inner.calls)
	}
	m := stallmeter.Start(t)
	for inner.calls == 0 {
		// Elapsed waits 30ms; the time the process stood still does not
		// count.
		if ran, stalled := m.Elapsed(); ran > 2*time.Second {
			t.Fatalf("no publish within 2s of a skipped round (and the process stalled %s; the renewal's tick is every %s): the skip did not ask for a renewal",
				stalled, embeddedLockTTL/3)
		}
		_ = p.Publish(t.Context(), []event.Envelope{e})
	}
}
