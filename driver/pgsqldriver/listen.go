package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

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
	conn, err := d.listenConn(ctx)
	if err != nil {
		return nil, err
	}
	wake := make(chan struct{}, 1)
	go d.listenLoop(ctx, conn, wake, onError)
	return wake, nil
}

// listenConn takes a connection of the pool and LISTENs on it.
func (d *Driver) listenConn(ctx context.Context) (*sql.Conn, error) {
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
		dropConn(conn)
		if errors.Is(err, errNotPgx) {
			return nil, err
		}
		return nil, fmt.Errorf("pgsqldriver: outbox listen: %w", err)
	}
	return conn, nil
}

// dropConn closes the driver connection under conn, so that the pool
// discards it rather than hand a LISTENing connection to someone else.
func dropConn(conn *sql.Conn) {
	_ = conn.Raw(func(dc any) error {
		if sc, ok := dc.(*stdlib.Conn); ok {
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = sc.Conn().Close(closeCtx)
		}
		return nil
	})
	_ = conn.Close()
}

func (d *Driver) listenLoop(ctx context.Context, conn *sql.Conn, wake chan<- struct{}, onError func(error)) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	report := func(err error) {
		if onError != nil && ctx.Err() == nil {
			onError(err)
		}
	}
	defer func() {
		if conn != nil {
			dropConn(conn)
		}
	}()
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = d.listenConn(ctx); err != nil {
				report(err)
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				delay = min(2*delay, 5*time.Second)
				continue
			}
			delay = 100 * time.Millisecond
			signal()
		}
		err := conn.Raw(func(dc any) error {
			pc := dc.(*stdlib.Conn).Conn()
			for {
				if _, err := pc.WaitForNotification(ctx); err != nil {
					return err
				}
				signal()
			}
		})
		if ctx.Err() != nil {
			return
		}
		report(fmt.Errorf("pgsqldriver: outbox listen: %w", err))
		dropConn(conn)
		conn = nil
	}
}
