package testdb

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxConns bounds the PostgreSQL connections the tests' own pools and
// connections hold at once, across every test process of the machine: a
// stock server allows 100, and what the tests start themselves (idemd
// processes, in-process apps with their own pools) needs the rest. A test
// whose requests hold connections while they wait for one that must finish
// (lease-mode duplicates) needs its pools' connections for real: keep the
// tests' pools small enough that two packages' fit.
const maxConns = 80

// slotWait bounds the wait for a connection slot.
const slotWait = 2 * time.Minute

// dial is pgx's default dialer behind a connection slot (acquireSlot),
// released when the connection closes.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	release, err := acquireSlot(ctx)
	if err != nil {
		return nil, err
	}
	c, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
	if err != nil {
		release()
		return nil, err
	}
	return &slotConn{Conn: c, release: release}, nil
}

// slotConn gives its slot back when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// connConfig parses DSN with the slot dialer.
func connConfig() (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(DSN())
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = dial
	return cfg, nil
}

// connect opens one connection to DSN through the slot dialer.
func connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := connConfig()
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}
