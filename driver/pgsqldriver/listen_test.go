package pgsqldriver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// enqueueOne commits one new outbox row.
func enqueueOne(t *testing.T, drv *pgsqldriver.Driver) {
	t.Helper()
	ctx := t.Context()
	tx, err := drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	row := driver.OutboxRow{EventID: uuid.Must(uuid.NewV7()), EventType: "T.v1", Key: "k", OccurredAt: now, Payload: []byte("{}"), CreatedAt: now}
	if _, err := drv.OutboxTx(tx).OutboxInsert(ctx, []driver.OutboxRow{row}); err != nil {
		t.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// The listener wakes on each committed enqueue, survives the loss of its
// connection (it reports it, reconnects and signals), and gives its
// connection back closed when its context ends.
func TestListenOutbox(t *testing.T) {
	t.Parallel()
	drv, _ := testdb.PostgresSQLSchema(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errs := make(chan error, 10)
	wake, err := drv.ListenOutbox(ctx, func(err error) { errs <- err })
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no wake-up within 30s", what)
		}
	}
	enqueueOne(t, drv)
	woken("enqueue committed")

	// Kill the listener's backend, as a failover or an idle-killer would.
	var killed int
	err = drv.DB().QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`,
		drv.OutboxChannel()).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminate listener: %d backends, %v; want 1", killed, err)
	}
	select {
	case err := <-errs:
		t.Logf("listener reported: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("listener did not report the lost connection")
	}
	woken("reconnected")
	deadline := time.Now().Add(5 * time.Second)
	for {
		enqueueOne(t, drv)
		select {
		case <-wake:
			cancel()
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no wake-up for commits after reconnecting")
		}
	}
}

// With a database/sql driver other than pgx's stdlib there is no listener:
// ListenOutbox says so, and a relay polls.
func TestListenOutboxNeedsPgx(t *testing.T) {
	t.Parallel()
	db := sql.OpenDB(wrappedConnector{testdb.DSN()})
	t.Cleanup(func() { _ = db.Close() })
	drv, err := pgsqldriver.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.ListenOutbox(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "not pgx") {
		t.Fatalf("ListenOutbox on another driver: %v; want the not-pgx error", err)
	}
}

// wrappedConnector is pgx's database/sql driver behind connections of
// another type, as any other driver's would be.
type wrappedConnector struct{ dsn string }

func (c wrappedConnector) Connect(context.Context) (sqldriver.Conn, error) {
	conn, err := stdlib.GetDefaultDriver().Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return wrappedConn{conn}, nil
}

func (wrappedConnector) Driver() sqldriver.Driver { return stdlib.GetDefaultDriver() }

type wrappedConn struct{ sqldriver.Conn }

// The listener holds none of the pool's connections: a relay on a pool of
// one connection still publishes (it held it for ever, and the relay's
// rounds waited for it, publishing nothing).
func TestListenOutboxLeavesThePool(t *testing.T) {
	t.Parallel()
	drv, _ := testdb.PostgresSQLSchema(t)
	drv.DB().SetMaxOpenConns(1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wake, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueueOne(t, drv) // needs the pool's only connection
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up within 30s")
	}
	var n int
	qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
	defer qcancel()
	if err := drv.DB().QueryRowContext(qctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a query on the pool while the listener runs: %d, %v", n, err)
	}
}

// The listener finds the outbox's schema as the pool's connections do,
// also when their search_path is set by the pool's own AfterConnect hook
// (stdlib.OptionAfterConnect), which a connection opened for the listener
// from the pool's pgx.ConnConfig does not run: without Config.Schema, a
// relay that listened first must still listen on the channel the
// enqueuers notify (and take their lane locks), or it is never woken.
func TestListenOutboxSearchPathFromAfterConnect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, schema := testdb.Schema(t, 1)
	cfg, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET search_path TO "+pgx.Identifier{schema}.Sanitize())
		return err
	}))
	t.Cleanup(func() { _ = db.Close() })
	enqueuer, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := enqueuer.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := pgsqldriver.New(db, nil) // a relay process: it listens first
	if err != nil {
		t.Fatal(err)
	}
	wake, err := relay.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	select { // the signal of the first connection
	case <-wake:
	default:
	}
	if got, want := relay.OutboxChannel(), enqueuer.OutboxChannel(); got != want {
		t.Errorf("OutboxChannel of a driver whose pool sets search_path = %q, want %q (the schema its tables are in)", got, want)
	}
	enqueueOne(t, enqueuer)
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("the listener was not woken by an enqueue into the schema its pool's search_path names")
	}
}

// The listener's notifications are its own: its connection is opened from
// the pool connection's pgx.ConnConfig, whose OnNotification callback
// appends to that pool connection's buffer. Kept, every notification the
// listener received piled up on a pool connection that never reads them
// (memory growing with every commit that enqueued), and two listeners
// copied from one pool connection appended to it at once (a data race).
func TestListenOutboxKeepsNotificationsOffThePool(t *testing.T) {
	t.Parallel()
	drv, _ := testdb.PostgresSQLSchema(t)
	drv.DB().SetMaxOpenConns(1) // both listeners copy the same pool connection
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wakeA, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	wakeB, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		enqueueOne(t, drv)
		for _, wake := range []<-chan struct{}{wakeA, wakeB} {
			select {
			case <-wake:
			case <-time.After(30 * time.Second):
				t.Fatalf("enqueue %d: no wake-up within 30s", i)
			}
		}
	}
	// The pool's connection never LISTENs: any notification buffered on it
	// came from a listener.
	conn, err := drv.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	err = conn.Raw(func(dc any) error {
		wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer wcancel()
		n, err := dc.(*stdlib.Conn).Conn().WaitForNotification(wctx)
		if n != nil {
			t.Errorf("the pool's connection holds a listener's notification (channel %q)", n.Channel)
		}
		return err
	})
	if err == nil {
		t.Error("WaitForNotification on the pool's connection returned without a notification or an error")
	}
}
