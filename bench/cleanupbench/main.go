package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/pgdriver"
)

type options struct {
	dsn       string
	rows      int
	writers   int
	ids       int
	slice     time.Duration
	batch     int
	pause     time.Duration
	partition bool
	hold      bool
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL; a private schema is created there and dropped at exit")
	flag.IntVar(&o.rows, "rows", 1_000_000, "expired rows to delete, and rows in the dropped day of partition mode")
	flag.IntVar(&o.writers, "writers", 4, "concurrent inserting goroutines")
	flag.IntVar(&o.ids, "ids", 5, "event ids inserted per transaction")
	flag.DurationVar(&o.slice, "slice", 3*time.Second, "slices without and with the cleaner alternate, each this long")
	flag.IntVar(&o.batch, "batch", cleanup.DefaultBatchSize, "cleaner BatchSize")
	flag.DurationVar(&o.pause, "pause", cleanup.DefaultPause, "cleaner Pause between batches (0: none)")
	flag.BoolVar(&o.partition, "partition", true, "also measure partition mode")
	flag.BoolVar(&o.hold, "hold-snapshot", false, "hold a REPEATABLE READ snapshot open on another connection during the sweep, "+
		"as a long report or a replica with hot_standby_feedback does (the deleted rows' index entries cannot be removed meanwhile); "+
		"the sweep then runs to its end in one slice")
	flag.Parse()
	if o.rows < 1 || o.writers < 1 || o.ids < 1 || o.slice <= 0 || o.batch < 1 || o.pause < 0 {
		fmt.Fprintln(os.Stderr, "cleanupbench: -rows, -writers, -ids, -slice and -batch must be positive, -pause not negative")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "cleanupbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "cleanupbench_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, o.dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	var version string
	if err := admin.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer func() {
		_, derr := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		err = errors.Join(err, derr)
	}()

	pcfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(o.writers + 4)
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := drv.Migrate(ctx); err != nil {
		return err
	}

	fmt.Printf("cleanupbench: PostgreSQL %s, GOMAXPROCS %d, schema %s\n", version, runtime.GOMAXPROCS(0), schema)
	fmt.Printf("insert load: %d writers, %d event ids per transaction (InboxInsert + COMMIT)\n", o.writers, o.ids)
	fmt.Printf("cleaner: BatchSize %d, Pause %s\n\n", o.batch, o.pause)

	if err := deleteMode(ctx, o, drv, admin, schema); err != nil {
		return err
	}
	if o.partition {
		return partitionMode(ctx, o, drv)
	}
	return nil
}

func deleteMode(ctx context.Context, o options, drv *pgdriver.Driver, admin *pgx.Conn, schema string) error {
	start := time.Now()
	if _, err := drv.Pool().Exec(ctx, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
		SELECT 'bench-old', gen_random_uuid(), now() - interval '5 days' - i * interval '1 ms'
		FROM generate_series(1, $1) AS i`, o.rows); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if _, err := drv.Pool().Exec(ctx, `VACUUM ANALYZE processed_event`); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	fmt.Printf("seed: %d expired processed_event rows in %s (INSERT ... SELECT generate_series, VACUUM ANALYZE)\n",
		o.rows, time.Since(start).Round(time.Millisecond))

	// Warm-up, not measured.
	if _, err := drive(ctx, o, drv, func(ctx context.Context, _ *clock) error { return sleepCtx(ctx, 2*time.Second) }); err != nil {
		return err
	}
	pause := o.pause
	if pause == 0 {
		pause = cleanup.NoPause
	}
	c, err := cleanup.New(drv, &cleanup.Config{BatchSize: o.batch, Pause: pause, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	readBefore, err := indexReads(ctx, drv, inboxIndex)
	if err != nil {
		return err
	}
	if o.hold {
		// The old snapshot: taken by the first statement of the
		// transaction, it holds back the removal of every row version
		// deleted after it until the transaction ends.
		if _, err := admin.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
			return err
		}
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "idem_lock"}.Sanitize()).Scan(&n); err != nil {
			return err
		}
		defer func() { _, _ = admin.Exec(context.Background(), `ROLLBACK`) }()
		fmt.Println("a REPEATABLE READ transaction on another connection holds its snapshot until the sweep is done")
	}
	// Slices without and with the cleaner take turns until the sweep is
	// done; an interrupted RunOnce is simply run again (deletes are
	// idempotent, and a new sweep starts from the oldest row), so drift
	// falls on both kinds alike. With -hold-snapshot the sweep runs to its
	// end in one slice: a new sweep would start again from the first
	// entries of the index, which the snapshot keeps.
	var deleted, batches, slicesWith int
	var sweepTime time.Duration
	load, err := drive(ctx, o, drv, func(ctx context.Context, clk *clock) error {
		for {
			clk.set(without)
			if err := sleepCtx(ctx, o.slice); err != nil {
				return err
			}
			clk.set(with)
			sliceCtx, cancel := context.WithCancel(ctx)
			if !o.hold {
				cancel()
				sliceCtx, cancel = context.WithTimeout(ctx, o.slice)
			}
			t := time.Now()
			rep, err := c.RunOnce(sliceCtx)
			sweepTime += time.Since(t)
			cancel()
			in := inboxReport(rep)
			deleted += in.Deleted
			batches += in.Batches
			slicesWith++
			switch {
			case err == nil:
				clk.set(without)
				return sleepCtx(ctx, o.slice) // a last slice without
			case ctx.Err() != nil:
				return ctx.Err()
			case !errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("sweep: %w", err)
			}
		}
	})
	if err != nil {
		return err
	}
	readAfter, err := indexReads(ctx, drv, inboxIndex)
	if err != nil {
		return err
	}
	// A statement cut off by the end of a slice may have deleted its
	// batch without reporting it: count what is left instead.
	var left int
	if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE consumer_name = 'bench-old'`).Scan(&left); err != nil {
		return err
	}
	removed := o.rows - left
	fmt.Printf("insert load and cleanup in alternating %s slices: %d with the cleaner sweeping, %d without\n\n", o.slice, slicesWith, slicesWith+1)
	printHeader()
	load[without].print("without cleanup")
	load[with].print("with cleanup")
	fmt.Println()
	fmt.Printf("cleanup: removed %d rows (%d left; %d counted by reports) in %s of sweeping = %.0f rows/s (%d batches of <= %d, %s pause between)\n",
		removed, left, deleted, sweepTime.Round(time.Millisecond), float64(removed)/sweepTime.Seconds(), batches, o.batch, o.pause)
	fmt.Printf("insert throughput during / without cleanup: %.2f (%.0f / %.0f tx/s; target >= 0.80)\n",
		load[with].txPerSec()/load[without].txPerSec(), load[with].txPerSec(), load[without].txPerSec())
	read := readAfter - readBefore
	fmt.Printf("index entries read by the sweep (%s, idx_tup_read): %d = %.2f per row removed\n",
		inboxIndex, read, float64(read)/float64(max(removed, 1)))
	return nil
}

// inboxIndex is the index the inbox sweep reads (the insert load does not).
const inboxIndex = "processed_event_processed_at_idx"

// indexReads returns idx_tup_read of index, once every idle connection of
// drv's pool (every one, between the phases) has flushed its statistics.
func indexReads(ctx context.Context, drv *pgdriver.Driver, index string) (int64, error) {
	for _, c := range drv.Pool().AcquireAllIdle(ctx) {
		// The session flushes when it goes idle, before it answers.
		_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
		if err != nil {
			return 0, err
		}
	}
	var n int64
	err := drv.Pool().QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
		WHERE schemaname = current_schema() AND indexrelname = $1`, index).Scan(&n)
	return n, err
}

func inboxReport(rep cleanup.Report) cleanup.TableReport {
	for _, t := range rep.Tables {
		if t.Table == cleanup.TableInbox {
			return t
		}
	}
	return cleanup.TableReport{}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
