package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
)

// bench holds what every scenario shares.
type bench struct {
	o      options
	admin  *pgx.Conn // the bench's own connection: schema, counters, checks
	schema string
	runID  string
	pools  int // pools opened so far, to name their sessions
}

// effectTables are the business tables of the consumer scenarios, one per
// scenario so that they do not contend nor grow each other's indexes.
var effectTables = []string{"effect_a", "effect_b", "effect_c", "effect_b2", "effect_c2", "effect_f", restartTable}

// createSchema creates the bench's schema and its business tables; idem's
// tables are created by pgdriver's Migrate.
func createSchema(ctx context.Context, conn *pgx.Conn, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	stmts := []string{"CREATE SCHEMA " + s}
	for _, t := range effectTables {
		// The effect of an event: one ledger row. No UNIQUE on event_id
		// on purpose: a duplicate effect must be countable.
		stmts = append(stmts, `CREATE TABLE `+s+`.`+t+` (
			id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			event_id uuid   NOT NULL,
			account  text   NOT NULL,
			amount   bigint NOT NULL)`)
	}
	stmts = append(stmts, `CREATE TABLE `+s+`.`+dedupFloorTable+` (event_id uuid, CONSTRAINT `+dedupFloorKey.Name+` PRIMARY KEY (event_id))`)
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	return nil
}

func (b *bench) migrate(ctx context.Context) error {
	pool, drv, err := b.open(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	return drv.Migrate(ctx)
}

// open returns a new pool of conns connections, all established, and a
// driver on it. Its sessions carry an application_name of their own, so
// that closePool can wait for their backends to exit (which flushes their
// statistics).
func (b *bench) open(ctx context.Context, conns int) (*pgxpool.Pool, *pgdriver.Driver, error) {
	b.pools++
	pcfg, err := pgxpool.ParseConfig(b.o.dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("parse dsn: %w", err)
	}
	pcfg.MaxConns = int32(conns)
	pcfg.MinConns = int32(conns)
	pcfg.ConnConfig.RuntimeParams["search_path"] = b.schema
	pcfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("%s_%d", b.schema, b.pools)
	if b.o.syncCommit != "" {
		pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = b.o.syncCommit
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: %w", err)
	}
	// Establish every connection now, outside the timed part.
	cs := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("pool: %w", err)
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		c.Release()
	}
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: b.schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, drv, nil
}

// closePool closes pool and waits (up to 5s) until its backends are gone:
// a backend flushes its statistics (pg_stat_wal, pg_stat_database) when it
// exits, so the counters read afterwards include all of its work.
func (b *bench) closePool(ctx context.Context, pool *pgxpool.Pool) error {
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	pool.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			return fmt.Errorf("wait for backends: %w", err)
		}
		if n == 0 || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pgCounters are cluster-wide counters of PostgreSQL 14+.
type pgCounters struct {
	walSync  int64 // WAL fsyncs (fdatasync, fsync, ...) issued
	walWrite int64 // WAL write() calls
	walBytes float64
	commits  int64 // transactions committed in this database
}

func (b *bench) counters(ctx context.Context) (pgCounters, error) {
	var c pgCounters
	err := b.admin.QueryRow(ctx, `SELECT w.wal_sync, w.wal_write, w.wal_bytes::float8, d.xact_commit
		FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()`).
		Scan(&c.walSync, &c.walWrite, &c.walBytes, &c.commits)
	if err != nil {
		return c, fmt.Errorf("read pg_stat_wal: %w", err)
	}
	return c, nil
}

func (c pgCounters) sub(p pgCounters) pgCounters {
	return pgCounters{c.walSync - p.walSync, c.walWrite - p.walWrite, c.walBytes - p.walBytes, c.commits - p.commits}
}

// conditions describes the machine and the settings of the run.
func (b *bench) conditions(ctx context.Context) (string, error) {
	var version, syncCommit, fsync, method, commitDelay string
	err := b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'),
		current_setting('fsync'), current_setting('wal_sync_method'), current_setting('commit_delay')`).
		Scan(&version, &syncCommit, &fsync, &method, &commitDelay)
	if err != nil {
		return "", fmt.Errorf("server settings: %w", err)
	}
	if b.o.syncCommit != "" {
		syncCommit = b.o.syncCommit + " (set by -synchronous-commit; server default " + syncCommit + ")"
	}
	var s strings.Builder
	fmt.Fprintf(&s, "conditions: %s %s/%s, GOMAXPROCS=%d (NumCPU=%d), PostgreSQL %s (local, same CPUs)\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), version)
	fmt.Fprintf(&s, "            synchronous_commit=%s, fsync=%s, wal_sync_method=%s, commit_delay=%s\n", syncCommit, fsync, method, commitDelay)
	fmt.Fprintf(&s, "            load average at start %s (the bench, PostgreSQL and kfake share these CPUs with whatever else runs)", loadAvg())
	return s.String(), nil
}
