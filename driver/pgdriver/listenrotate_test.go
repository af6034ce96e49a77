package pgdriver_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// Dynamic credentials rotated under a running listener (Vault's database
// secrets engine: a new role at each lease, the old one's sessions
// terminated and the role dropped when its lease ends). With
// ListenConnConfig set, the pool's BeforeConnect is not the listener's:
// Config.ListenBeforeConnect gives each of its connections the current
// credentials, and the listener reconnects as the new role and wakes the
// relay again. Without it, ListenConnConfig's role was used for ever: every
// reconnection was refused (the role no longer exists) and the relay fell
// back to polling.
func TestListenOutboxListenBeforeConnectRotatedRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 2)
	oldRole := fmt.Sprintf("rotate_%d", time.Now().UnixNano())
	newRole := oldRole + "_next"
	for _, r := range []string{oldRole, newRole} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", r)
			_, _ = pool.Exec(ctx, "DROP ROLE IF EXISTS "+r)
		})
	}
	lc, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	var role atomic.Value
	role.Store(oldRole)
	drv := newDriver(t, pool, &pgdriver.Config{Schema: schema, ListenConnConfig: lc,
		ListenBeforeConnect: func(_ context.Context, c *pgx.ConnConfig) error {
			c.User = role.Load().(string)
			return nil
		}})
	if err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 100)
	wake, err := drv.ListenOutbox(ctx, func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	listeningAs := func(r string) bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN %'`, r).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if !listeningAs(oldRole) {
		t.Fatalf("the listener does not LISTEN as %s", oldRole)
	}

	// Rotate: the new role first, then the old one revoked.
	role.Store(newRole)
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", oldRole); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DROP ROLE "+oldRole); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !listeningAs(newRole) {
		if time.Now().After(deadline) {
			t.Fatalf("the listener did not reconnect as %s within 20s", newRole)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for drained := false; !drained; { // the reconnection's signal
		select {
		case <-wake:
		default:
			drained = true
		}
	}
	enqueue(t, drv, newEvent(t, "k", 1))
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("the listener was not woken by an enqueue after the rotation")
	}
}
