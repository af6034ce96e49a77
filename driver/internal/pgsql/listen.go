package pgsql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listener is what ListenLoop needs of a LISTENing connection: Wait blocks
// until a notification arrives (nil) or the connection fails or ctx ends
// (an error); Close gives the connection up.
type Listener interface {
	Wait(ctx context.Context) error
	Close()
}

// ListenLoop keeps an outbox listener alive until ctx is done. It signals
// wake (capacity 1, never blocking) on each notification and once after
// each reconnection (notifications sent while disconnected are lost); on a
// connection error it reports to onError (if not nil, and not once ctx is
// done), gives the connection up and reconnects through connect with
// backoff from 100ms to 5s, reporting each failed attempt too, and calls
// onError(nil) once it has reconnected, so that the caller can log the end
// of the errors (and throttle their lines in between). It closes its
// connection when it returns. name prefixes the errors it reports
// ("pgdriver").
func ListenLoop(ctx context.Context, name string, l Listener, connect func(context.Context) (Listener, error),
	wake chan<- struct{}, onError func(error)) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	failing := false // errors reported since the last connection
	report := func(err error) {
		if onError != nil && ctx.Err() == nil {
			onError(err)
		}
		failing = err != nil
	}
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		if l == nil {
			var err error
			if l, err = connect(ctx); err != nil {
				report(err)
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				delay = min(2*delay, 5*time.Second)
				continue
			}
			delay = 100 * time.Millisecond
			if failing {
				report(nil)
			}
			signal()
		}
		if err := l.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			report(fmt.Errorf("%s: outbox listen: %w", name, err))
			l.Close()
			l = nil
			continue
		}
		signal()
	}
}

// CheckListenSession returns an error wrapping errors.ErrUnsupported when
// conn goes through a pooler: the server process running its statements
// is not the one it was given at its start (a pooler that can cancel
// queries gives each client a process ID of its own). In transaction mode
// such a pooler passes a notification to a client only while the client
// runs a transaction, so a LISTEN there would never wake anyone. name
// prefixes the error ("pgdriver"); hint says how to give the listener a
// connection of its own.
func CheckListenSession(ctx context.Context, conn *pgx.Conn, name, hint string) error {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return fmt.Errorf("%s: outbox listen: %w", name, err)
	}
	if pid != conn.PgConn().PID() {
		return ListenPooledError(name, hint)
	}
	return nil
}

// ListenPooledError is CheckListenSession's error.
func ListenPooledError(name, hint string) error {
	return fmt.Errorf("%s: outbox listen: the connection goes through a pooler (the server process running its statements "+
		"is not the one it was given at its start), which in transaction mode delivers no notification between "+
		"transactions: %s (the relay polls until then): %w", name, hint, errors.ErrUnsupported)
}
