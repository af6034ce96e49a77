package app

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dbclock"
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
func TestEmbeddedLeaseNotTakenByAHostAhead(t *testing.T) {
	t.Parallel()
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
	ahead := dbclock.New(drv, second.log, "embedded broker")
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
