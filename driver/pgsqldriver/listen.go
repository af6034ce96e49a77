package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// errNotPgx: LISTEN needs a connection of pgx's database/sql driver.
var errNotPgx = errors.New("pgsqldriver: outbox listen: the database/sql driver is not pgx's stdlib (with another one, relays poll)")

// ListenOutbox implements outbox.Notifier when the database/sql driver
// underneath is pgx's stdlib ("pgx", stdlib.OpenDB): it takes one
// connection of the *sql.DB for as long as ctx lives, LISTENs on
// OutboxChannel there and signals the returned channel (capacity 1, never
// blocking) on each notification and after each reconnection (a
// notification may have been missed meanwhile). Errors after the start go to
// onError. With another driver (lib/pq) it returns an error, and a relay
// polls every RelayConfig.PollInterval instead.
func (d *Driver) ListenOutbox(ctx context.Context, onError func(error)) (<-chan struct{}, error) {
	l, err := d.listenConn(ctx)
	if err != nil {
		return nil, err
	}
	wake := make(chan struct{}, 1)
	go pgsql.ListenLoop(ctx, "pgsqldriver", l, d.listenConn, wake, onError)
	return wake, nil
}

// listener is a connection of the pool LISTENing on the outbox channel.
type listener struct{ conn *sql.Conn }

func (l listener) Wait(ctx context.Context) error {
	return l.conn.Raw(func(dc any) error {
		_, err := dc.(*stdlib.Conn).Conn().WaitForNotification(ctx)
		return err
	})
}

// Close closes the driver connection under the *sql.Conn, so that the pool
// discards it rather than hand a LISTENing connection to someone else.
func (l listener) Close() {
	_ = l.conn.Raw(func(dc any) error {
		if sc, ok := dc.(*stdlib.Conn); ok {
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = sc.Conn().Close(closeCtx)
		}
		return nil
	})
	_ = l.conn.Close()
}

// listenConn takes a connection of the pool and LISTENs on it.
func (d *Driver) listenConn(ctx context.Context) (pgsql.Listener, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errNotPgx
		}
		_, err := sc.Conn().Exec(ctx, "LISTEN "+pgx.Identifier{d.OutboxChannel()}.Sanitize())
		return err
	})
	if err != nil {
		listener{conn}.Close()
		if errors.Is(err, errNotPgx) {
			return nil, err
		}
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	return listener{conn}, nil
}
