package pgsqldriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// errNotPgx: LISTEN needs a connection of pgx's database/sql driver.
// It wraps errors.ErrUnsupported: a relay does not try again.
var errNotPgx = fmt.Errorf("pgsqldriver: outbox listen: the database/sql driver is not pgx's stdlib (with another one, relays poll): %w", errors.ErrUnsupported)

// ListenOutbox implements outbox.Notifier when the database/sql driver
// underneath is pgx's stdlib ("pgx", stdlib.OpenDB): for as long as ctx
// lives, it keeps a connection of its own (opened with the settings of a
// connection of the *sql.DB, which it borrows for a moment; it holds none
// of the pool's, so relays never starve the pool or each other), LISTENs
// on OutboxChannel there and signals the returned channel (capacity 1,
// never blocking; connecting and LISTENing get 30s) on each notification and after each reconnection (a
// notification may have been missed meanwhile). A connection that, after
// 30s without a notification, does not answer a round trip within 5s (a
// network that drops its packets without closing it) is given up and
// replaced, as one that failed. Errors after the start go to onError, each failed attempt to reconnect's too (every 5s at most),
// and onError(nil) once it has reconnected after errors. With another driver (lib/pq) it returns an error wrapping
// errors.ErrUnsupported, and a relay polls every RelayConfig.PollInterval
// instead; so it does behind a pooler in transaction mode, unless
// Config.ListenConnConfig gives it a direct connection.
func (d *Driver) ListenOutbox(ctx context.Context, onError func(error)) (<-chan struct{}, error) {
	if d.cfg.NoOutboxNotify {
		return nil, fmt.Errorf("%s: outbox listen: %w", "pgsqldriver", driver.ErrOutboxNotifyOff)
	}
	l, err := pgsql.ListenConnect(ctx, d.listenConn)
	if err != nil {
		return nil, err
	}
	wake := make(chan struct{}, 1)
	go pgsql.ListenLoop(ctx, "pgsqldriver", l, d.listenConn, wake, onError)
	return wake, nil
}

// listener is a connection of its own LISTENing on the outbox channel.
type listener struct{ conn *pgx.Conn }

func (l listener) Wait(ctx context.Context) error {
	_, err := l.conn.WaitForNotification(ctx)
	return err
}

func (l listener) Ping(ctx context.Context) error { return l.conn.Ping(ctx) }

func (l listener) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
}

// listenConn opens a connection with the settings of the pool's (read
// from one it borrows and gives back at once, which also finds the
// outbox's schema when Config.Schema is "") and LISTENs on it.
func (d *Driver) listenConn(ctx context.Context) (pgsql.Listener, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	var cfg *pgx.ConnConfig
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errNotPgx
		}
		cfg = sc.Conn().Config().Copy()
		// The copy's OnNotification appends to the pool connection's
		// buffer (pgx installs it at connect): cleared, the listener's
		// connection buffers its own notifications.
		cfg.OnNotification = nil
		return nil
	})
	if errors.Is(err, errNotPgx) {
		_ = conn.Close()
		return nil, err
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	// The schema is found through the pool's connection, not the
	// listener's: the pool's may have a search_path of their own (set by
	// an AfterConnect hook of stdlib.OpenDB, which the listener's does not
	// run), and the enqueuers notify the channel named after it.
	names, err := d.outboxNames(ctx, conn)
	_ = conn.Close() // back to the pool
	if err != nil {
		return nil, err
	}
	if d.cfg.ListenConnConfig != nil {
		cfg = d.cfg.ListenConnConfig.Copy()
	}
	if before := d.cfg.ListenBeforeConnect; before != nil {
		if err := before(ctx, cfg); err != nil {
			return nil, fmt.Errorf("pgsqldriver: outbox listen: Config.ListenBeforeConnect: %w", err)
		}
	}
	pc, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	if d.cfg.ListenConnConfig == nil {
		if err := pgsql.CheckListenSession(ctx, pc, "pgsqldriver", "set pgsqldriver.Config.ListenConnConfig to a direct connection to PostgreSQL"); err != nil {
			listener{pc}.Close()
			return nil, err
		}
	}
	if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{names.OutboxChannel()}.Sanitize()); err != nil {
		listener{pc}.Close()
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	return listener{pc}, nil
}
