package outbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// A relay whose pooled connections were cut off without a reset (the
// primary's host gone in a failover, a NAT or firewall losing the
// connections' state) waited on them for as long as TCP took to give up,
// or for ever when a middlebox kept acknowledging: its round's Begin and
// claim ran on Run's context, without a deadline, so the relay published
// nothing, and said nothing, while new connections worked. The claim is
// now bounded: the round fails (and is logged), and the next one takes a
// new connection.
func TestRunRecoversFromABlackHoledConnection(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		drv, enq, p := proxiedPostgres(t, 1)
		testRecoversFromABlackHole(t, drv, enq, p)
	})
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		drv, enq, p := proxiedPostgresSQL(t, 1)
		testRecoversFromABlackHole[*sql.Tx](t, drv, enq, p)
	})
}

func testRecoversFromABlackHole[TTx any](t *testing.T, drv, enq driver.OutboxDriver[TTx], p *testdb.Proxy) {
	published := make(chan event.Envelope, 10)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		NoListen: true, Concurrency: 1, PollInterval: 20 * time.Millisecond,
		OnPublished: func(es []event.Envelope) { // marks committed
			for _, e := range es {
				published <- e
			}
		},
		OnLag:  func(time.Duration) {}, // its query too must not hang on a black-holed connection
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, relay)
	wait := func(e event.Envelope, within time.Duration, what string) {
		t.Helper()
		select {
		case got := <-published:
			if got.ID != e.ID {
				t.Fatalf("published %s, want %s", got.ID, e.ID)
			}
		case <-time.After(within):
			t.Fatalf("%s: not published within %s", what, within)
		}
	}
	first := mustEvent(t, "k")
	enqueueTx(t, enq, first)
	wait(first, 10*time.Second, "before the partition")

	p.BlackHoleAll() // the relay's pooled connections are cut off
	second := mustEvent(t, "k")
	enqueueTx(t, enq, second)
	// The worst case with a pool of one connection: a lag query holds it
	// for its 5s, a round then for the claim's 15s, and pgxpool keeps the
	// dead connection's slot until pgx has drained it, up to 15s more (pgx
	// waits for the server's close, which a black hole never sends); 35s
	// in all, plus the scheduling of a loaded machine (CI ran over 45s).
	// Before the claim was bounded the relay waited for TCP to give up:
	// about 15 minutes.
	wait(second, 75*time.Second, "after the relay's connections were black-holed (new connections work)")
}

// proxiedPostgres returns a migrated pgdriver on a fresh schema whose pool
// (conns connections) goes through a fault proxy, another driver on the
// same schema with direct connections (to enqueue), and the proxy.
func proxiedPostgres(t *testing.T, conns int32) (drv, direct *pgdriver.Driver, p *testdb.Proxy) {
	t.Helper()
	pool, schema := testdb.Schema(t, 2)
	p = testdb.NewProxy(t)
	drv, err := pgdriver.New(p.Pool(t, schema, conns), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if direct, err = pgdriver.New(pool, &pgdriver.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return drv, direct, p
}

// proxiedPostgresSQL is proxiedPostgres for pgsqldriver.
func proxiedPostgresSQL(t *testing.T, conns int) (drv, direct *pgsqldriver.Driver, p *testdb.Proxy) {
	t.Helper()
	_, schema := testdb.Schema(t, 1)
	p = testdb.NewProxy(t)
	db := stdlib.OpenDB(*p.ConnConfig(t, schema))
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { _ = db.Close() })
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if direct, err = pgsqldriver.New(testdb.SQLPool(t, schema, 2), &pgsqldriver.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return drv, direct, p
}
