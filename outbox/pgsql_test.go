package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// PostgreSQL over database/sql (pgsqldriver): events enqueued in the
// caller's *sql.Tx are published by a relay on the same driver, in order,
// once; and a pgdriver listener on the same schema is woken by the enqueue.
func TestRelayPostgresSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv, schema := testdb.PostgresSQLSchema(t)
	pg, err := pgdriver.New(testdb.Pool(t, schema, 2), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	wake, err := pg.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	events := []event.Envelope{mustEvent(t, "k1"), mustEvent(t, "k2"), mustEvent(t, "k1")}
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Error("the pgdriver listener was not woken by pgsqldriver's enqueue")
	}

	var published []event.Envelope
	pub := outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		published = append(published, batch...)
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second round finds nothing left
		if _, err := relay.RunOnce(ctx); err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
	}
	if len(published) != len(events) {
		t.Fatalf("published %d events, want %d", len(published), len(events))
	}
	var k1 []string
	for _, e := range published {
		if e.Key == "k1" {
			k1 = append(k1, e.ID.String())
		}
	}
	if len(k1) != 2 || k1[0] != events[0].ID.String() || k1[1] != events[2].ID.String() {
		t.Errorf("events of key k1 published as %v, want %s then %s", k1, events[0].ID, events[2].ID)
	}
	if _, ok, err := drv.Outbox().OutboxOldestUnpublished(ctx); err != nil || ok {
		t.Errorf("OutboxOldestUnpublished after the relay: %v, %v; want nothing left", ok, err)
	}
}

// A relay on pgsqldriver over pgx's stdlib listens by itself: with a poll
// interval of an hour, each committed event is still published at once.
func TestRelayPostgresSQLListens(t *testing.T) {
	t.Parallel()
	drv, _ := testdb.PostgresSQLSchema(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	published := make(chan time.Time, 10)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: time.Hour, // a publish can only come from a wake-up
		OnPublished:  func([]event.Envelope) { published <- time.Now() },
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // listening, first round over: it now waits an hour
	for i := range 3 {
		committed := time.Now()
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, "order-1")); err != nil {
			t.Fatal(err)
		}
		if err := drv.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-published:
			t.Logf("event %d published %s after its commit", i, at.Sub(committed))
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d not published 30s after its commit (poll interval 1h): the relay did not listen", i)
		}
	}
	cancel()
	<-done
}

// A relay round waiting in Begin for a connection (the pool exhausted by
// the application, or the server unreachable) ends when Run's context is
// cancelled: a shutdown does not wait for a connection to come free.
func TestRunCancelledWhileBeginWaits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, name := range []string{"pgdriver", "pgsqldriver"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var (
				relay interface{ Run(context.Context) error }
				hold  func() (release func())
			)
			cfg := &outbox.RelayConfig{NoListen: true, Concurrency: 1, PollInterval: 10 * time.Millisecond}
			pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
			if name == "pgdriver" {
				pool, schema := testdb.Schema(t, 1)
				drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				if err := drv.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				r, err := outbox.NewRelay(drv, pub, cfg)
				if err != nil {
					t.Fatal(err)
				}
				relay = r
				hold = func() func() {
					conn, err := pool.Acquire(ctx)
					if err != nil {
						t.Fatal(err)
					}
					return conn.Release
				}
			} else {
				drv := testdb.PostgresSQL(t)
				drv.DB().SetMaxOpenConns(1)
				r, err := outbox.NewRelay(drv, pub, cfg)
				if err != nil {
					t.Fatal(err)
				}
				relay = r
				hold = func() func() {
					conn, err := drv.DB().Conn(ctx)
					if err != nil {
						t.Fatal(err)
					}
					return func() { _ = conn.Close() }
				}
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- relay.Run(rctx) }()
			time.Sleep(100 * time.Millisecond)
			release := hold()                  // the application holds the only connection
			time.Sleep(100 * time.Millisecond) // the relay's next round waits in Begin
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(3 * time.Second):
				t.Error("Run did not return within 3s of its context's end: its round waits in Begin")
				release()
				<-done
				return
			}
			release()
		})
	}
}

// EnqueueTx refuses what an outbox cannot hold, before anything is stored:
// on PostgreSQL a key over 1 KiB was stored, but could never be marked
// failed or parked (its index entry was too large), so the relay
// published its lanes' batches again every round and never marked them.
func TestEnqueueRefusesUnstorableEvents(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.Postgres(t)
	for _, bad := range []event.Envelope{
		mustEvent(t, strings.Repeat("k", event.MaxKeyBytes+1)),
		func() event.Envelope { e := mustEvent(t, "k"); e.Headers = map[string]string{"sig": "a\x00"}; return e }(),
	} {
		tx, err := drv.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = outbox.EnqueueTx(ctx, drv, tx, mustEvent(t, "fine"), bad)
		_ = drv.Rollback(ctx, tx)
		if !errors.Is(err, event.ErrInvalidKey) && !errors.Is(err, event.ErrInvalidText) {
			t.Errorf("EnqueueTx of an unstorable event: %v; want ErrInvalidKey or ErrInvalidText", err)
		}
	}
}

// A publisher whose error text holds a NUL byte or invalid UTF-8 (a raw
// broker message) has it stored cleaned: on PostgreSQL the mark was refused
// (SQLSTATE 22021), the whole round rolled back with the marks of the events
// that were published, and the relay published them again every round.
func TestRelayStoresUnprintableErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.Postgres(t)
	good, bad := mustEvent(t, "good"), mustEvent(t, "bad")
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, good, bad); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	published := map[string]int{}
	pub := outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		errs := make([]error, len(batch))
		for i, e := range batch {
			if e.Key == "bad" {
				errs[i] = errors.New("broker said \x00\xff" + strings.Repeat("x", 100<<10))
				continue
			}
			published[e.ID.String()]++
		}
		return &outbox.PublishError{Errs: errs}
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := relay.RunOnce(ctx); err != nil {
			t.Logf("RunOnce: %v", err)
		}
	}
	if n := published[good.ID.String()]; n != 1 {
		t.Errorf("the good event was published %d times in 3 rounds; want once", n)
	}
}

// rollbackOrderDriver records, at each Rollback, whether the context its
// transaction was begun on had ended already, and fails every mark: the
// round publishes, cannot record it, and rolls back.
type rollbackOrderDriver struct {
	driver.Driver[*sql.Tx]
	mu        sync.Mutex
	beginCtx  map[*sql.Tx]context.Context
	endedAtRB []bool
}

func (d *rollbackOrderDriver) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := d.Driver.Begin(ctx)
	if err == nil {
		d.mu.Lock()
		d.beginCtx[tx] = ctx
		d.mu.Unlock()
	}
	return tx, err
}

func (d *rollbackOrderDriver) Rollback(ctx context.Context, tx *sql.Tx) error {
	d.mu.Lock()
	if bctx, ok := d.beginCtx[tx]; ok {
		d.endedAtRB = append(d.endedAtRB, bctx.Err() != nil)
	}
	d.mu.Unlock()
	return d.Driver.Rollback(ctx, tx)
}

func (d *rollbackOrderDriver) OutboxTx(tx *sql.Tx) driver.OutboxExecutor {
	return failMarks{d.Driver.OutboxTx(tx)}
}

type failMarks struct{ driver.OutboxExecutor }

func (failMarks) OutboxMarkPublished(context.Context, *driver.OutboxMarkPublishedParams) error {
	return errors.New("connection lost before the marks")
}

// On database/sql, a round that fails after its claim rolls its
// transaction back before RunOnce returns: the context the transaction was
// begun on is still live at the Rollback. It used to be cancelled first,
// so database/sql rolled back asynchronously, the explicit Rollback
// returned at once, and the rows could still be locked when the relay (or
// another one) claimed again: their next round skipped them.
func TestRoundRollsBackBeforeItsContextEnds(t *testing.T) {
	t.Parallel()
	base, _ := testdb.PostgresSQLSchema(t)
	checkRollbackBeforeContextEnds(t, base, 3)
}

// checkRollbackBeforeContextEnds enqueues two events on base, runs rounds
// relay rounds whose marks fail, and checks that each rolled back while
// the context its transaction was begun on was still live.
func checkRollbackBeforeContextEnds(t *testing.T, base driver.Driver[*sql.Tx], rounds int) {
	t.Helper()
	ctx := t.Context()
	drv := &rollbackOrderDriver{Driver: base, beginCtx: map[*sql.Tx]context.Context{}}
	enqueueTx[*sql.Tx](t, base, mustEvent(t, "k1"), mustEvent(t, "k2"))
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay[*sql.Tx](drv, pub, &outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		if n, err := relay.RunOnce(ctx); err == nil || n != 0 {
			t.Fatalf("round %d: RunOnce with failing marks = %d, %v; want 0 and the mark error", round, n, err)
		}
	}
	drv.mu.Lock()
	defer drv.mu.Unlock()
	if len(drv.endedAtRB) != rounds {
		t.Fatalf("%d rollbacks of a begun transaction; want %d", len(drv.endedAtRB), rounds)
	}
	for i, ended := range drv.endedAtRB {
		if ended {
			t.Errorf("round %d: the transaction's context had ended at its Rollback (rolled back asynchronously, locks held after RunOnce)", i)
		}
	}
}

// A driver with NoOutboxNotify (pgsqldriver's here) enqueues without
// pg_notify: its relay polls, says so once at INFO (a choice, not a
// fault: no WARN), and publishes what was enqueued within its
// PollInterval.
func TestRelayDriverWithoutNotify(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, schema := testdb.SQLDB(t, 6)
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema, NoOutboxNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	published := make(chan event.Envelope, 1)
	pub := outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		for _, e := range batch {
			published <- e
		}
		return nil
	})
	buf := &testlog.Buffer{}
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{PollInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, relay)
	e := mustEvent(t, "k")
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-published:
		if got.ID != e.ID {
			t.Fatalf("published %s, want %s", got.ID, e.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the polling relay did not publish the event within 30s")
	}
	logs := buf.String()
	if !strings.Contains(logs, "level=INFO") || !strings.Contains(logs, "do not notify, polling only") {
		t.Errorf("no INFO line saying the relay polls because the inserts do not notify:\n%s", logs)
	}
	if strings.Contains(logs, "level=WARN") {
		t.Errorf("a WARN for a driver configured not to notify:\n%s", logs)
	}
}
