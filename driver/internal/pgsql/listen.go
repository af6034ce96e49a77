package pgsql

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listener is what ListenLoop needs of a LISTENing connection: Wait blocks
// until a notification arrives (nil) or the connection fails or ctx ends
// (an error, after which the connection is still usable when it was only
// ctx); Ping makes one round trip; Close gives the connection up.
type Listener interface {
	Wait(ctx context.Context) error
	Ping(ctx context.Context) error
	Close()
}

// A listener that had no notification for ListenCheckEvery checks that its
// connection still answers, within ListenCheckTimeout: a connection that
// stopped answering without being closed (a network partition, a failover
// behind a load balancer or NAT, a firewall that lost its state) fails no
// Wait, and would otherwise be waited on for as long as TCP keepalives
// take (pgx's: 5 min idle, then probes 5 min apart), for ever behind a
// middlebox that acknowledges, every notification lost meanwhile. A
// reconnection gets ListenConnectTimeout.
const (
	ListenCheckEvery     = 30 * time.Second
	ListenCheckTimeout   = 5 * time.Second
	ListenConnectTimeout = 30 * time.Second
)

// listenCheckEvery and listenCheckTimeout are ListenCheckEvery and
// ListenCheckTimeout, in nanoseconds, unless a test changed them
// (SetListenCheck).
var (
	listenCheckEvery     = durationVar(ListenCheckEvery)
	listenCheckTimeout   = durationVar(ListenCheckTimeout)
	listenConnectTimeout = durationVar(ListenConnectTimeout)
)

// ListenConnect runs connect (a listener's connection) within
// ListenConnectTimeout: a connection that the network black-holes while
// it is made (a partition that closes nothing) fails then, and is tried
// again, instead of waiting as long as TCP does.
func ListenConnect(ctx context.Context, connect func(context.Context) (Listener, error)) (Listener, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(listenConnectTimeout.Load()))
	defer cancel()
	return connect(ctx)
}

// SetListenConnectTimeout sets ListenConnect's bound, for tests, and
// returns a function that puts the default back.
func SetListenConnectTimeout(d time.Duration) (restore func()) {
	listenConnectTimeout.Store(int64(d))
	return func() { listenConnectTimeout.Store(int64(ListenConnectTimeout)) }
}

func durationVar(d time.Duration) *atomic.Int64 {
	v := new(atomic.Int64)
	v.Store(int64(d))
	return v
}

// SetListenCheck sets how often and within how long listeners started
// from now on check their connection, for tests, and returns a function
// that puts the defaults back.
func SetListenCheck(every, timeout time.Duration) (restore func()) {
	listenCheckEvery.Store(int64(every))
	listenCheckTimeout.Store(int64(timeout))
	return func() {
		listenCheckEvery.Store(int64(ListenCheckEvery))
		listenCheckTimeout.Store(int64(ListenCheckTimeout))
	}
}

// ListenLoop keeps an outbox listener alive until ctx is done. It signals
// wake (capacity 1, never blocking) on each notification and once after
// each reconnection (notifications sent while disconnected are lost); on a
// connection error, or a connection that does not answer a check (see
// ListenCheckEvery), it reports to onError (if not nil, and not once ctx is
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
	every, timeout := time.Duration(listenCheckEvery.Load()), time.Duration(listenCheckTimeout.Load())
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		if l == nil {
			var err error
			l, err = ListenConnect(ctx, connect)
			if err != nil {
				l = nil
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
		wctx, cancel := context.WithTimeout(ctx, every)
		err := l.Wait(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(wctx.Err(), context.DeadlineExceeded) {
				// No notification for a while: does the connection
				// still answer?
				pctx, cancel := context.WithTimeout(ctx, timeout)
				err = l.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
				if ctx.Err() != nil {
					return
				}
				err = fmt.Errorf("the connection did not answer a check within %s (the network to the database drops packets?): %w", timeout, err)
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
