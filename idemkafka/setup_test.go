package idemkafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

type sqlTx = sql.Tx

func kfakeFault(key kmsg.Key, topic string, err *kerr.Error, count int) kfake.Fault {
	return kfake.Fault{Keys: []kmsg.Key{key}, Topic: topic, Err: err, Count: count}
}

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// effectRow is one committed effect: a row the handler wrote in the
// business table "effect" through the inbox's transaction.
type effectRow struct {
	ID  uuid.UUID
	Key string
	N   int
}

// backend is a database with the business table. Every consumer instance
// gets its own connection pool from open, as a separate process would.
type backend[TTx any] struct {
	name string
	// open returns a new driver (pool) on the test database.
	open func(t testing.TB) driver.Driver[TTx]
	// effect writes e's effect for consumer through tx.
	effect func(ctx context.Context, tx TTx, consumer string, e event.Envelope) error
	// rows returns consumer's committed effects in the order they were
	// applied.
	rows func(t testing.TB, consumer string) []effectRow
	// processed counts consumer's processed_event rows.
	processed func(t testing.TB, consumer string) int
	// env tells a child process how to reach the database.
	env []string
}

const (
	envBackend = "IDEMKAFKA_TEST_BACKEND"
	envTarget  = "IDEMKAFKA_TEST_TARGET"
)

const (
	pgEffectTable     = `CREATE TABLE effect (seq bigserial PRIMARY KEY, consumer text NOT NULL, event_id uuid NOT NULL, key text NOT NULL, n int NOT NULL)`
	sqliteEffectTable = `CREATE TABLE effect (seq INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT NOT NULL, event_id TEXT NOT NULL, key TEXT NOT NULL, n INTEGER NOT NULL)`
	effectRowsQuery   = `SELECT event_id, key, n FROM effect WHERE consumer = %s ORDER BY seq`
	processedQuery    = `SELECT count(*) FROM processed_event WHERE consumer_name = %s`
)

type payload struct {
	N int `json:"n"`
}

func payloadN(e event.Envelope) (int, error) {
	var p payload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return 0, fmt.Errorf("payload of %s: %w", e.ID, err)
	}
	return p.N, nil
}

func setupPostgres(t testing.TB) *backend[pgx.Tx] {
	t.Helper()
	_, schema := testdb.Schema(t, 1)
	return postgresAt(t, schema, true)
}

// postgresAt returns the backend of the PostgreSQL schema, creating its
// tables if create.
func postgresAt(t testing.TB, schema string, create bool) *backend[pgx.Tx] {
	t.Helper()
	pool := testdb.Pool(t, schema, 2)
	open := func(t testing.TB) driver.Driver[pgx.Tx] {
		t.Helper()
		drv, err := pgdriver.New(testdb.Pool(t, schema, 4), &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatalf("pgdriver.New: %v", err)
		}
		return drv
	}
	if create {
		if err := open(t).Migrate(context.Background()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if _, err := pool.Exec(context.Background(), pgEffectTable); err != nil {
			t.Fatalf("create effect table: %v", err)
		}
	}
	return &backend[pgx.Tx]{
		name: "postgres",
		open: open,
		effect: func(ctx context.Context, tx pgx.Tx, consumer string, e event.Envelope) error {
			n, err := payloadN(e)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO effect (consumer, event_id, key, n) VALUES ($1, $2, $3, $4)`, consumer, e.ID, e.Key, n)
			return err
		},
		rows: func(t testing.TB, consumer string) []effectRow {
			t.Helper()
			rows, err := pool.Query(context.Background(), fmt.Sprintf(effectRowsQuery, "$1"), consumer)
			if err != nil {
				t.Fatalf("query effects: %v", err)
			}
			out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effectRow, error) {
				var e effectRow
				err := r.Scan(&e.ID, &e.Key, &e.N)
				return e, err
			})
			if err != nil {
				t.Fatalf("read effects: %v", err)
			}
			return out
		},
		processed: func(t testing.TB, consumer string) int {
			t.Helper()
			var n int
			if err := pool.QueryRow(context.Background(), fmt.Sprintf(processedQuery, "$1"), consumer).Scan(&n); err != nil {
				t.Fatalf("count processed_event: %v", err)
			}
			return n
		},
		env: []string{envBackend + "=postgres", envTarget + "=" + schema},
	}
}

func setupSQLite(t testing.TB) *backend[*sql.Tx] {
	t.Helper()
	return sqliteAt(t, testdb.SQLitePath(t), true)
}

// sqliteAt returns the backend of the SQLite file at path, creating its
// tables if create.
func sqliteAt(t testing.TB, path string, create bool) *backend[*sql.Tx] {
	t.Helper()
	open := func(t testing.TB) driver.Driver[*sql.Tx] {
		t.Helper()
		drv, err := sqlitedriver.Open(path, nil)
		if err != nil {
			t.Fatalf("sqlitedriver.Open: %v", err)
		}
		t.Cleanup(func() { _ = drv.Close() })
		return drv
	}
	if create {
		drv := open(t).(*sqlitedriver.Driver)
		if err := drv.Migrate(context.Background()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if _, err := drv.DB().Exec(sqliteEffectTable); err != nil {
			t.Fatalf("create effect table: %v", err)
		}
	}
	// A reader of its own: the drivers' single connections stay free.
	db, err := sql.Open("sqlite", sqlitedriver.DSN(path, 0))
	if err != nil {
		t.Fatalf("open reader: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &backend[*sql.Tx]{
		name: "sqlite",
		open: open,
		effect: func(ctx context.Context, tx *sql.Tx, consumer string, e event.Envelope) error {
			n, err := payloadN(e)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO effect (consumer, event_id, key, n) VALUES (?, ?, ?, ?)`, consumer, e.ID.String(), e.Key, n)
			return err
		},
		rows: func(t testing.TB, consumer string) []effectRow {
			t.Helper()
			rows, err := db.Query(fmt.Sprintf(effectRowsQuery, "?"), consumer)
			if err != nil {
				t.Fatalf("query effects: %v", err)
			}
			defer rows.Close()
			var out []effectRow
			for rows.Next() {
				var (
					e  effectRow
					id string
				)
				if err := rows.Scan(&id, &e.Key, &e.N); err != nil {
					t.Fatalf("read effects: %v", err)
				}
				e.ID = uuid.MustParse(id)
				out = append(out, e)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("read effects: %v", err)
			}
			return out
		},
		processed: func(t testing.TB, consumer string) int {
			t.Helper()
			var n int
			if err := db.QueryRow(fmt.Sprintf(processedQuery, "?"), consumer).Scan(&n); err != nil {
				t.Fatalf("count processed_event: %v", err)
			}
			return n
		},
		env: []string{envBackend + "=sqlite", envTarget + "=" + path},
	}
}

// forEachBackend runs a scenario on PostgreSQL and on SQLite, in parallel.
func forEachBackend(t *testing.T, pg func(*testing.T, *backend[pgx.Tx]), lite func(*testing.T, *backend[*sql.Tx])) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testdb.RequirePostgres(t)
		pg(t, setupPostgres(t))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		lite(t, setupSQLite(t))
	})
}

// testLogger discards logs unless IDEMKAFKA_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("IDEMKAFKA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// consumerConfig is the configuration the tests start from: the handler
// writes the effect after hook (if any) returned nil; retries are quick; the
// group notices a new member within 200ms.
func consumerConfig[TTx any](kc *kafkatest.Cluster, b *backend[TTx], consumer, group string, hook func(e event.Envelope) error, topics ...string) idemkafka.ConsumerConfig[TTx] {
	return consumerConfigAt(kc.Seeds, b, consumer, group, hook, topics...)
}

func consumerConfigAt[TTx any](seeds []string, b *backend[TTx], consumer, group string, hook func(e event.Envelope) error, topics ...string) idemkafka.ConsumerConfig[TTx] {
	return idemkafka.ConsumerConfig[TTx]{
		Seeds:  seeds,
		Group:  group,
		Topics: topics,
		Handler: func(ctx context.Context, tx TTx, e event.Envelope) error {
			if hook != nil {
				if err := hook(e); err != nil {
					return err
				}
			}
			return b.effect(ctx, tx, consumer, e)
		},
		Retry: idemkafka.Retry{Attempts: 3, Backoff: func(int) time.Duration { return 10 * time.Millisecond }},
		ExtraOpts: []kgo.Opt{
			kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.SessionTimeout(6 * time.Second),
		},
		Logger: testLogger(),
	}
}

// totals sums the BatchStats a consumer reported.
type totals struct {
	mu                                 sync.Mutex
	batches, applied, duplicates, dead int
	rewound, failures, commitFailures  int
}

func (s *totals) add(b idemkafka.BatchStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches++
	s.applied += b.Applied
	s.duplicates += b.Duplicates
	s.dead += b.DeadLettered
	s.rewound += b.Rewound
	s.failures += b.Failures
	if !b.Committed && b.Records > b.Rewound {
		s.commitFailures++
	}
}

func (s *totals) get() totals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return totals{batches: s.batches, applied: s.applied, duplicates: s.duplicates, dead: s.dead,
		rewound: s.rewound, failures: s.failures, commitFailures: s.commitFailures}
}

// instance is a running consumer.
type instance struct {
	stats  *totals
	cancel context.CancelFunc
	done   chan error
}

// start runs a consumer with cfg on a new connection pool of b, under the
// inbox consumer name consumer, until stop (or the end of the test).
func start[TTx any](t *testing.T, b *backend[TTx], consumer string, cfg idemkafka.ConsumerConfig[TTx], setup ...func(*idemkafka.Consumer[TTx])) *instance {
	t.Helper()
	drv := b.open(t)
	in, err := inbox.New(drv, &inbox.Config{Consumer: consumer, Logger: testLogger()})
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	return startWith(t, drv, in, cfg, setup...)
}

func startWith[TTx any](t *testing.T, drv driver.Driver[TTx], in *inbox.Inbox[TTx], cfg idemkafka.ConsumerConfig[TTx], setup ...func(*idemkafka.Consumer[TTx])) *instance {
	t.Helper()
	inst := &instance{stats: &totals{}, done: make(chan error, 1)}
	user := cfg.OnBatch
	cfg.OnBatch = func(ctx context.Context, s idemkafka.BatchStats) {
		inst.stats.add(s)
		if user != nil {
			user(ctx, s)
		}
	}
	c, err := idemkafka.NewConsumer(in, &cfg)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	for _, f := range setup {
		f(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst.cancel = cancel
	go func() { inst.done <- c.Run(ctx) }()
	t.Cleanup(func() { _ = inst.stop() })
	return inst
}

// stop cancels the consumer and waits for Run to return.
func (in *instance) stop() error {
	in.cancel()
	select {
	case err, ok := <-in.done:
		if !ok {
			return nil
		}
		close(in.done)
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("consumer did not stop within 30s")
	}
}

func mustStop(t *testing.T, in *instance) {
	t.Helper()
	if err := in.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitProgress waits until cond reports done, as long as the progress it
// reports (a count that grows while the work goes on: effects applied,
// offsets committed) grew within the last idle: on a busy machine the work
// may take minutes, and only a stall of idle fails the test.
func waitProgress(t *testing.T, idle time.Duration, what string, cond func() (done bool, progress int64)) {
	t.Helper()
	start := time.Now()
	done, last := cond()
	lastAt := time.Now()
	for !done {
		if time.Since(lastAt) > idle {
			t.Fatalf("waiting for %s: no progress for %s (at %d, after %s)", what, idle, last, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
		var p int64
		if done, p = cond(); p != last {
			last, lastAt = p, time.Now()
		}
	}
}

// consumedTopic creates an "orders" topic of partitions partitions and its
// dead-letter topic on kc, and names a consumer group for it.
func consumedTopic(t *testing.T, kc *kafkatest.Cluster, partitions int32) (topic, group string) {
	t.Helper()
	topic = kc.Topic(t, "orders", partitions)
	kc.CreateTopic(t, topic+idemkafka.DeadLetterSuffix, 1)
	return topic, kafkatest.Name("g")
}

// newEvents returns n events spread over keys aggregates; event i's
// payload is {"n": i}.
func newEvents(t testing.TB, n, keys int) []event.Envelope {
	t.Helper()
	out := make([]event.Envelope, n)
	for i := range out {
		e, err := event.New("OrderCreated.v1", fmt.Sprintf("order-%d", i%keys), payload{N: i})
		if err != nil {
			t.Fatalf("event.New: %v", err)
		}
		out[i] = e
	}
	return out
}

func recordsOf(topic string, evs ...event.Envelope) []*kgo.Record {
	out := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		out[i] = idemkafka.Record(topic, e)
	}
	return out
}

// counts returns how many effects each event has.
func counts(rows []effectRow) map[uuid.UUID]int {
	out := make(map[uuid.UUID]int, len(rows))
	for _, r := range rows {
		out[r.ID]++
	}
	return out
}

// mustOnce checks that every event of evs took effect exactly once for
// consumer and nothing else did.
func mustOnce[TTx any](t *testing.T, b *backend[TTx], consumer string, evs []event.Envelope) {
	t.Helper()
	rows := b.rows(t, consumer)
	got := counts(rows)
	bad := 0
	for _, e := range evs {
		if n := got[e.ID]; n != 1 {
			bad++
			if bad <= 5 {
				t.Errorf("event %d (%s) took effect %d times; want 1", mustN(t, e), e.ID, n)
			}
		}
	}
	if len(rows) != len(evs) || bad > 0 {
		t.Fatalf("%d effect rows for %d events, %d events not exactly once", len(rows), len(evs), bad)
	}
	if n := b.processed(t, consumer); n != len(evs) {
		t.Fatalf("%d processed_event rows; want %d", n, len(evs))
	}
}

func mustN(t testing.TB, e event.Envelope) int {
	t.Helper()
	n, err := payloadN(e)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// distinct is the number of events with an effect.
func distinct[TTx any](t testing.TB, b *backend[TTx], consumer string) int {
	return len(counts(b.rows(t, consumer)))
}

// allCommitted reports whether group committed every partition of topic up
// to its end.
func allCommitted(t testing.TB, kc *kafkatest.Cluster, group, topic string) bool {
	t.Helper()
	committed := kc.Committed(t, group, topic)
	for p, end := range kc.EndOffsets(t, topic) {
		if end > 0 && committed[p] != end {
			return false
		}
	}
	return true
}
