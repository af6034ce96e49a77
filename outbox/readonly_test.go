package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// TestRelayDatabaseReadOnly: the relay's sessions are read-only (a hot
// standby reached after a failover, or default_transaction_read_only) while
// 16 events wait: its rounds fail, and no event is charged an attempt,
// backed off or parked for the database's failure. Once a failover gives
// it a writable primary (the role's setting reset, its sessions ended),
// the relay publishes each event once.
func TestRelayDatabaseReadOnly(t *testing.T) {
	t.Parallel()
	t.Run("pgdriver", func(t *testing.T) {
		t.Parallel()
		relayReadOnly(t, func(t *testing.T, cfg *pgx.ConnConfig, schema string) driver.OutboxDriver[pgx.Tx] {
			pcfg, err := pgxpool.ParseConfig(testdb.DSN())
			if err != nil {
				t.Fatal(err)
			}
			pcfg.MaxConns = 2
			pcfg.ConnConfig = cfg
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return drv
		})
	})
	// database/sql reports no server parameter: the claim asks.
	t.Run("pgsqldriver", func(t *testing.T) {
		t.Parallel()
		relayReadOnly(t, func(t *testing.T, cfg *pgx.ConnConfig, schema string) driver.OutboxDriver[*sql.Tx] {
			db := stdlib.OpenDB(*cfg)
			db.SetMaxOpenConns(2)
			t.Cleanup(func() { _ = db.Close() })
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return drv
		})
	})
}

// relayReadOnly runs TestRelayDatabaseReadOnly with the driver open makes
// for a connection config (the relay's role's).
func relayReadOnly[TTx any](t *testing.T, open func(t *testing.T, cfg *pgx.ConnConfig, schema string) driver.OutboxDriver[TTx]) {
	ctx := context.Background()
	owner, schema := testdb.Schema(t, 2)
	mig, err := pgdriver.New(owner, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	role := schema + "_relay"
	exec(`CREATE ROLE ` + role + ` LOGIN`)
	exec(`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role)
	exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + role)
	exec(`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA ` + schema + ` TO ` + role)
	t.Cleanup(func() {
		_, _ = owner.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = owner.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = owner.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})

	events := make([]event.Envelope, 16)
	for i := range events {
		events[i] = mustEvent(t, []string{"k1", "k2", "k3"}[i%3])
	}
	tx, err := mig.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, mig, tx, events...); err != nil {
		t.Fatal(err)
	}
	if err := mig.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	exec(`ALTER ROLE ` + role + ` SET default_transaction_read_only = on`)
	cfg, err := pgx.ParseConfig(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = role
	drv := open(t, cfg, schema)
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	pub := outbox.PublisherFunc(func(_ context.Context, batch []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			seen[e.ID.String()]++
		}
		return nil
	})
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := relay.RunOnce(ctx); err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("round %d while read-only: %v; want a read-only failure", i, err)
		}
	}
	var charged int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM outbox_pending WHERE attempts > 0 OR parked_at IS NOT NULL OR next_attempt_at IS NOT NULL`).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if charged != 0 || len(seen) != 0 {
		t.Fatalf("while read-only: %d events charged an attempt, backed off or parked, %d published; want none", charged, len(seen))
	}

	exec(`ALTER ROLE ` + role + ` RESET default_transaction_read_only`)
	exec(`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = '` + role + `'`)
	for range 3 { // a round may find a connection the failover ended
		_, _ = relay.RunOnce(ctx)
	}
	if len(seen) != len(events) {
		t.Fatalf("published %d events after the failover, want %d", len(seen), len(events))
	}
	for _, e := range events {
		if n := seen[e.ID.String()]; n != 1 {
			t.Errorf("event %s published %d times, want 1", e.ID, n)
		}
	}
}
