package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// A relay that lives through many losses of its database connections (a
// failover, a restart: every session of the relay's pool and its
// listener terminated) leaves no goroutine and no session behind: after
// each loss it reconnects and publishes, and the process holds as many
// goroutines and sessions as before. Not parallel: it counts the
// process's goroutines.
func TestRelaySurvivesConnectionLossesWithoutLeaking(t *testing.T) {
	admin, schema := testdb.Schema(t, 1)
	app := "relayleak-" + schema
	pool := testdb.PoolParams(t, schema, 4, map[string]string{"application_name": app})
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: 200 * time.Millisecond,
		OnPublished:  func(es []event.Envelope) { published.Add(int64(len(es))) },
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	sessions := func() int {
		var n int
		if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cycle := func(i int) {
		want := published.Load() + 1
		var err error
		for range 6 { // the pool's connections the loss ended fail once each
			if err = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
				return outbox.EnqueueTx(t.Context(), drv, tx, mustEvent(t, "k"))
			}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("cycle %d: enqueue: %v", i, err)
		}
		for deadline := time.Now().Add(30 * time.Second); published.Load() < want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: event not published within 30s", i)
			}
		}
		if _, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		cycle(i)
	}
	time.Sleep(time.Second)
	runtime.GC()
	before, beforeSessions := runtime.NumGoroutine(), sessions()
	const losses = 20
	for i := range losses {
		cycle(i)
	}
	var after, afterSessions int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		runtime.GC()
		after, afterSessions = runtime.NumGoroutine(), sessions()
		if (after <= before+3 && afterSessions <= beforeSessions+2) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("goroutines %d -> %d, sessions %d -> %d over %d losses", before, after, beforeSessions, afterSessions, losses)
	if after > before+3 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after %d connection losses, %d before:\n%s", after, losses, before, buf[:runtime.Stack(buf, true)])
	}
	if afterSessions > beforeSessions+2 || afterSessions > 5 {
		t.Errorf("%d sessions after %d connection losses, %d before (pool of 4 and a listener)", afterSessions, losses, beforeSessions)
	}
}
