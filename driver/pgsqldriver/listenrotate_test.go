package pgsqldriver_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/internal/testdb"
)

// Dynamic credentials rotated under a running listener (Vault's database
// secrets engine: a new role at each lease, the old one's sessions
// terminated and the role dropped when its lease ends), the *sql.DB's
// connections getting theirs from stdlib.OptionBeforeConnect. The
// listener copies the settings of a pooled connection, opened with the
// old role: Config.ListenBeforeConnect gives each of its connections the
// current credentials, and it reconnects as the new role and wakes the
// relay again. Without it, it reconnected with what the borrowed
// connection had been opened with: refused for as long as the pool kept
// such a connection.
func TestListenOutboxListenBeforeConnectRotatedRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, schema := testdb.Schema(t, 2)
	oldRole := fmt.Sprintf("rotate_%d", time.Now().UnixNano())
	newRole := oldRole + "_next"
	for _, r := range []string{oldRole, newRole} {
		for _, q := range []string{"CREATE ROLE " + r + " LOGIN", "GRANT ALL ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + r} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", r)
			_, _ = admin.Exec(ctx, "DROP OWNED BY "+r)
			_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+r)
		})
	}
	cfg, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	var role atomic.Value
	role.Store(oldRole)
	current := func(_ context.Context, c *pgx.ConnConfig) error {
		c.User = role.Load().(string)
		return nil
	}
	db := stdlib.OpenDB(*cfg, stdlib.OptionBeforeConnect(current))
	db.SetMaxOpenConns(1) // the listener borrows the connection opened with the old role
	t.Cleanup(func() { _ = db.Close() })
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema, ListenBeforeConnect: current})
	if err != nil {
		t.Fatal(err)
	}
	enqueuer, err := pgsqldriver.New(stdlib.OpenDBFromPool(admin), &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := enqueuer.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wake, err := drv.ListenOutbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListenOutbox: %v", err)
	}
	listeningAs := func(r string) bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN %'`, r).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if !listeningAs(oldRole) {
		t.Fatalf("the listener does not LISTEN as %s", oldRole)
	}

	// Rotate: the new role first, then the old one's listener session
	// terminated (its pooled connection stays idle in the *sql.DB) and
	// the role's login revoked.
	role.Store(newRole)
	if _, err := admin.Exec(ctx, "ALTER ROLE "+oldRole+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN %'", oldRole); err != nil {
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
	enqueueOne(t, enqueuer)
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Error("the listener was not woken by an enqueue after the rotation")
	}
}
