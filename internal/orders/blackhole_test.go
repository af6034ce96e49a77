package orders_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/orders"
	ordpg "github.com/idemkit/idem/internal/orders/pgstore"
	paypg "github.com/idemkit/idem/internal/payments/pgstore"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/saga"
)

// proxiedSaga is a payment saga and its stores on PostgreSQL whose
// connections go through a fault proxy (the tables made directly).
func proxiedSaga(t *testing.T, log *slog.Logger) (*orders.PaymentSaga[pgx.Tx], *pgdriver.Driver, *ordpg.Store, *testdb.Proxy) {
	t.Helper()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	direct, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := paypg.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ordpg.New(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proxy := testdb.NewProxy(t)
	ppool := proxy.Pool(t, schema, 4)
	drv, err := pgdriver.New(ppool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	sagas, err := saga.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ord := ordpg.New(ppool)
	return orders.NewPaymentSaga(sagas, ord, paypg.New(ppool), log), drv, ord, proxy
}

// A watchdog round whose listing goes on a pooled connection the network
// black-holes (a partition that closes nothing: a failover behind a load
// balancer or NAT) fails within RoundTimeout, reported (Partial) and
// logged; the next rounds, on other connections, succeed. Before, the
// round waited as long as TCP does (for ever behind this proxy, which
// acknowledges), and no round was reported.
func TestWatchdogRoundGivesUpABlackHoledConnection(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ps, drv, ord, proxy := proxiedSaga(t, log)
	rounds := make(chan orders.WatchdogStats, 100)
	wd, err := orders.NewWatchdog(drv, ps, ord, orders.WatchdogConfig{StuckAfter: time.Minute, GiveUpAfter: 30 * time.Minute,
		Interval: 100 * time.Millisecond, RoundTimeout: time.Second,
		OnRound: func(s orders.WatchdogStats) {
			select {
			case rounds <- s:
			default:
			}
		}}, log)
	if err != nil {
		t.Fatal(err)
	}
	f := proxy.Arm(testdb.BlackHole, func(b []byte) bool { return bytes.Contains(b, []byte("FROM customer_order")) })
	t.Cleanup(f.Cut)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = wd.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	started := time.Now()
	select {
	case s := <-rounds:
		t.Logf("first round reported %s after the start: %+v", time.Since(started).Round(time.Millisecond), s)
		if !s.Partial {
			t.Fatalf("the first round, black-holed, was not Partial: %+v", s)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no watchdog round reported within 60 s of a black-holed listing (RoundTimeout 1s)")
	}
	select {
	case <-f.Fired():
	default:
		t.Fatal("the fault did not fire")
	}
	if !strings.Contains(logs.String(), "order watchdog: round failed") || !strings.Contains(logs.String(), "not done within 1s") {
		t.Errorf("the failed round was not logged as such:\n%s", logs.String())
	}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case s := <-rounds:
			if !s.Partial {
				return
			}
		case <-deadline:
			t.Fatal("no round succeeded after the black-holed one")
		}
	}
}

// The saga compensator's Recover whose listing goes on a pooled connection
// the network black-holes fails within its bound, logged; the next goes on
// another connection. Before, it waited as long as TCP does, compensating
// nothing and logging nothing.
func TestCompensatorGivesUpABlackHoledConnection(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ps, _, _, proxy := proxiedSaga(t, log)
	orders.SetRecoverTimeout(ps, time.Second)
	f := proxy.Arm(testdb.BlackHole, func(b []byte) bool { return bytes.Contains(b, []byte("ORDER BY updated_at, saga_id")) })
	t.Cleanup(f.Cut)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ps.RunCompensator(ctx, nil, time.Hour)
	}()
	t.Cleanup(func() { cancel(); <-done })
	started := time.Now()
	for !strings.Contains(logs.String(), "order saga: recovery failed") {
		if time.Since(started) > 60*time.Second {
			t.Fatal("the compensator reported nothing within 60 s of a black-holed listing (bound 1s)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the compensator reported the failure %s after it started", time.Since(started).Round(time.Millisecond))
	if !strings.Contains(logs.String(), "not done within 1s") {
		t.Errorf("the failure does not say the bound:\n%s", logs.String())
	}
	select {
	case <-f.Fired():
	default:
		t.Fatal("the fault did not fire")
	}
	if _, err := ps.Recover(t.Context(), orders.RecoverBatch); err != nil {
		t.Fatalf("Recover after the black-holed one: %v", err)
	}
}
