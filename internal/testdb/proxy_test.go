package testdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
)

// BlackHoleAll cuts off every connection the proxy carries, without a
// reset: a query on one gets no answer and no error until its context
// ends, while a connection made afterwards works.
func TestProxyBlackHoleAll(t *testing.T) {
	t.Parallel()
	p := testdb.NewProxy(t)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.ConnectConfig(t.Context(), p.ConnConfig(t, "public"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		return c
	}
	ping := func(c *pgx.Conn, within time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), within)
		defer cancel()
		return c.Ping(ctx)
	}
	a, b := connect(), connect()
	// (a and b are not closed here: pgx gives a connection up when a
	// query's context ends, and the proxy closes what is left.)
	if err := ping(a, 5*time.Second); err != nil {
		t.Fatalf("ping before: %v", err)
	}
	fs := p.BlackHoleAll()
	if len(fs) != 2 {
		t.Fatalf("%d connections black-holed, want 2", len(fs))
	}
	for _, c := range []*pgx.Conn{a, b} {
		if err := ping(c, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("ping of a black-holed connection: %v; want no answer until the deadline", err)
		}
	}
	after := connect()
	defer after.Close(context.Background())
	if err := ping(after, 5*time.Second); err != nil {
		t.Errorf("ping on a new connection: %v", err)
	}
}
