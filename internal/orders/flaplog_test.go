package orders_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/saga"
)

// flappingSagas is a saga driver on a database short of connections
// (SQLSTATE 53300): every other pass of the compensator fails (its first
// listing, of the compensating sagas).
type flappingSagas struct {
	*sqlitedriver.Driver
	calls atomic.Int64
	// failing turns the flapping on.
	failing atomic.Bool
}

func (d *flappingSagas) Sagas() driver.SagaExecutor {
	return flappingExecutor{d.Driver.Sagas(), d}
}

type flappingExecutor struct {
	driver.SagaExecutor
	d *flappingSagas
}

func (e flappingExecutor) SagaList(ctx context.Context, p *driver.SagaListParams) ([]driver.Saga, error) {
	if len(p.States) == 1 && p.States[0] == driver.SagaCompensating && e.d.calls.Add(1)%2 == 0 && e.d.failing.Load() {
		return nil, &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: `too many connections for role "idemd"`}
	}
	return e.SagaExecutor.SagaList(ctx, p)
}

// fakeNow is a clock that moves on by step at every reading.
type fakeNow struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func (c *fakeNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

// A compensator whose passes alternate failing and succeeding (a database
// short of connections: some get one, some do not), woken after every
// consumer batch, logs one line when the failures start, a summary every
// 30 s with the failed and the good passes, and one line once no pass
// failed for 10 s. It logged a WARN per failed pass: hundreds a minute.
func TestCompensatorLogsAFlappingFailureOnce(t *testing.T) {
	t.Parallel()
	sdrv, pay, ord := sqliteStores(t)
	drv := &flappingSagas{Driver: sdrv}
	drv.failing.Store(true)
	var logs testlog.Buffer
	sagas, err := saga.New[*sql.Tx](drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := orders.NewPaymentSaga(sagas, ord, pay, slog.New(slog.NewTextHandler(&logs, nil)))
	// Each pass reads the clock about twice: about 100 ms a pass.
	clock := &fakeNow{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), step: 50 * time.Millisecond}
	orders.SetClock(ps, clock.Now)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	wake := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ps.RunCompensator(ctx, wake, time.Hour)
	}()
	defer func() { cancel(); <-done }()
	passes := func(n int) {
		for range n {
			select {
			case wake <- struct{}{}:
			case <-time.After(10 * time.Second):
				t.Fatal("the compensator was not woken within 10 s")
			}
		}
	}
	passes(1000) // about 100 s of flapping
	drv.failing.Store(false)
	passes(300) // 30 s without a failure
	count := func(prefix string) int { return strings.Count(logs.String(), "msg=\""+prefix) }
	failed, still, ended := count("order saga: recovery failed"), count("order saga: recovery still failing"), count("order saga: recovery succeeds again")
	t.Logf("%d passes: %d 'recovery failed', %d 'still failing', %d 'succeeds again' lines", drv.calls.Load(), failed, still, ended)
	if failed != 1 || still < 2 || still > 4 || ended != 1 {
		t.Errorf("%d 'recovery failed', %d 'still failing', %d 'succeeds again' lines; want 1, about 3 (one per 30 s) and 1; logs:\n%s",
			failed, still, ended, logs.String())
	}
	if !strings.Contains(logs.String(), "53300") || !strings.Contains(logs.String(), "passed=") {
		t.Errorf("the lines do not say the error or the good passes:\n%s", logs.String())
	}
}

// A watchdog whose rounds alternate failing and succeeding (a database
// short of connections) logs one line when the failures start, a summary
// every 30 s, and one line once no round failed for 10 s. It logged a WARN
// per failed round.
func TestWatchdogLogsAFlappingFailureOnce(t *testing.T) {
	t.Parallel()
	f := newWatchdogFixture(t, 10)
	var (
		logs    testlog.Buffer
		calls   atomic.Int64
		failing atomic.Bool
		rounds  atomic.Int64
	)
	failing.Store(true)
	lister := listerFunc(func(ctx context.Context, before time.Time, afterID int64, limit int) ([]orders.Stale, error) {
		if calls.Add(1)%2 == 0 && failing.Load() {
			return nil, &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: `too many connections for role "idemd"`}
		}
		return f.ord.ListCreatedBefore(ctx, before, afterID, limit)
	})
	// Each round reads the clock once or twice: 100 ms or so a round.
	clock := &fakeNow{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), step: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wd, err := orders.NewWatchdog(f.drv, nil, lister, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		Interval: time.Millisecond, Now: clock.Now, OnRound: func(orders.WatchdogStats) {
			switch rounds.Add(1) {
			case 1000: // about 100 s of flapping
				failing.Store(false)
			case 1500: // 50 s without a failure
				cancel()
			}
		}}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := wd.Run(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(prefix string) int { return strings.Count(logs.String(), "msg=\""+prefix) }
	failed, still, ended := count("order watchdog: round failed"), count("order watchdog: rounds still failing"), count("order watchdog: rounds succeed again")
	t.Logf("%d rounds: %d 'round failed', %d 'still failing', %d 'succeed again' lines", rounds.Load(), failed, still, ended)
	if failed != 1 || still < 1 || still > 4 || ended != 1 {
		t.Errorf("%d 'round failed', %d 'still failing', %d 'succeed again' lines; want 1, one per 30 s and 1; logs:\n%s",
			failed, still, ended, logs.String())
	}
}
