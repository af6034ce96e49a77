package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// stallingDial dials as usual until stall is set; then a new connection
// waits until its context ends (or the test does), as behind a pooler
// whose server pool is full (PgBouncer queues the client for
// query_wait_timeout, 2 min by default) or a server too busy to accept.
func stallingDial(stall *atomic.Bool, done <-chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if stall.Load() {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-done:
				return nil, net.ErrClosed
			}
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// A relay whose wake-up listener was slow to connect (a pooler queueing
// the connection, a server slow to accept) published nothing until it had
// connected: Run started the listener before its first round, and waited
// for it, without a word, however long it took. The pool's connections
// were there: the relay polls with them while the listener connects.
func TestRunPublishesWhileTheListenerConnects(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		_, schema := testdb.Schema(t, 1)
		var stall atomic.Bool
		done := make(chan struct{})
		defer close(done) // before the pool's cleanup, which waits for its dials
		cfg, err := pgxpool.ParseConfig(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		cfg.ConnConfig.DialFunc = stallingDial(&stall, done)
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		stall.Store(true) // the pool keeps its connection; new ones wait
		testPublishesWhileTheListenerConnects(t, drv)
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		_, schema := testdb.Schema(t, 1)
		var stall atomic.Bool
		done := make(chan struct{})
		defer close(done) // before the pool's cleanup, which waits for its dials
		cfg, err := pgx.ParseConfig(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["search_path"] = schema
		cfg.DialFunc = stallingDial(&stall, done)
		db := stdlib.OpenDB(*cfg)
		t.Cleanup(func() { _ = db.Close() })
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		stall.Store(true)
		testPublishesWhileTheListenerConnects[*sql.Tx](t, drv)
	})
}

func testPublishesWhileTheListenerConnects[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	e := mustEvent(t, "k")
	enqueueTx(t, drv, e)
	published := make(chan struct{}, 1)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: 20 * time.Millisecond,
		OnPublished: func([]event.Envelope) {
			select {
			case published <- struct{}{}:
			default:
			}
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(ctx)
	}()
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Error("the event was not published in 5s, with a poll interval of 20ms, while the wake-up listener connected")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return 5s after its context ended")
	}
}
