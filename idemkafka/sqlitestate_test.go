package idemkafka_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// The embedded default runs on a SQLite file, whose disk can fill up (a
// -wal file that grew behind a long reader, a log volume shared with the
// database) or turn read-only (a filesystem remounted read-only after an
// I/O error). The records are fine: none may be dead-lettered, and each is
// applied once the file takes writes again.

// sqliteRefusedFor runs 16 events through a consumer on SQLite whose
// handler, while refused is set, runs refuse on its transaction after
// writing the effect (and returns its error); the consumer must log the
// failure (a line holding want) more than Retry.Attempts times, then apply
// each event once and dead-letter none once refused is cleared.
func sqliteRefusedFor(t *testing.T, want string, refuse func(ctx context.Context, tx *sql.Tx) error) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 16, 4)

	var refused atomic.Bool
	refused.Store(true)
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	drv := b.open(t)
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = logger
	cfg.Handler = func(ctx context.Context, tx *sql.Tx, e event.Envelope) error {
		if err := b.effect(ctx, tx, "billing", e); err != nil {
			return err
		}
		if refused.Load() {
			return refuse(ctx, tx)
		}
		return nil
	}
	inst := startWith(t, drv, in, cfg)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	// Retry.Attempts is 3: a record blamed for the refusal would be
	// dead-lettered by now. The refusal is logged once (its repeats are
	// summarised every 30 s), and counted in the batches' stats.
	waitFor(t, 60*time.Second, "the consumer failed on the refusal 8 times", func() bool {
		return strings.Contains(logs.String(), want) && inst.stats.get().failures >= 8
	})
	refused.Store(false)
	waitFor(t, 60*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	s := inst.stats.get()
	t.Logf("stats: %d batches, %d applied, %d duplicates, %d failures, %d rewound, %d dead-lettered",
		s.batches, s.applied, s.duplicates, s.failures, s.rewound, s.dead)
	if s.dead != 0 {
		t.Errorf("%d records dead-lettered; want none: the database refused the writes, not the records", s.dead)
	}
	if n := kc.EndOffsets(t, topic+idemkafka.DeadLetterSuffix)[0]; n != 0 {
		t.Errorf("dead-letter topic holds %d records; want 0", n)
	}
	mustOnce(t, b, "billing", evs)
}

// TestConsumerSQLiteDiskFull: the file may not grow (SQLITE_FULL,
// "database or disk is full": max_page_count capped at the file's size
// stands in for a full disk) while the handler writes a page's worth more.
func TestConsumerSQLiteDiskFull(t *testing.T) {
	sqliteRefusedFor(t, "database or disk is full", func(ctx context.Context, tx *sql.Tx) error {
		var pages int64
		if err := tx.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
			return err
		}
		var capped int64
		if err := tx.QueryRowContext(ctx, `PRAGMA max_page_count = `+strconv.FormatInt(pages, 10)).Scan(&capped); err != nil {
			return err
		}
		defer func() { _, _ = tx.ExecContext(context.WithoutCancel(ctx), `PRAGMA max_page_count = 4294967294`) }()
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS filler (b BLOB); INSERT INTO filler VALUES (zeroblob(1048576))`)
		return err
	})
}

// TestConsumerSQLiteReadOnly: the file refuses writes (SQLITE_READONLY,
// "attempt to write a readonly database": query_only stands in for a
// filesystem remounted read-only).
func TestConsumerSQLiteReadOnly(t *testing.T) {
	sqliteRefusedFor(t, "readonly database", func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `PRAGMA query_only = 1`); err != nil {
			return err
		}
		defer func() { _, _ = tx.ExecContext(context.WithoutCancel(ctx), `PRAGMA query_only = 0`) }()
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS filler (b BLOB); INSERT INTO filler VALUES (x'00')`)
		return err
	})
}
