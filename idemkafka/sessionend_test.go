package idemkafka_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// PostgreSQL ends the consumer's sessions on purpose, as production
// servers do: pg_terminate_backend by a DBA, a restart or failover (57P01
// admin_shutdown), the role's idle_in_transaction_session_timeout (25P03).

// sessionConsumer starts a consumer of topic on a pool of the schema whose
// sessions have params, and returns it with its log.
func sessionConsumer(t *testing.T, kc *kafkatest.Cluster, b *backend[pgx.Tx], schema, group, topic string, params map[string]string,
	handler func(ctx context.Context, tx pgx.Tx, e event.Envelope) error) (*instance, *testlog.Buffer) {
	t.Helper()
	drv, err := pgdriver.New(testdb.PoolParams(t, schema, 4, params), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	in, err := inbox.New[pgx.Tx](drv, &inbox.Config{Consumer: "billing", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Handler = handler
	cfg.Logger = logger
	return startWith(t, drv, in, cfg), logs
}

// terminateApp terminates the backends whose application_name is app and
// waits for them to exit; it returns how many there were.
func terminateApp(t *testing.T, admin *pgxpool.Pool, app string) int {
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n); err != nil {
		t.Errorf("pg_terminate_backend: %v", err)
	}
	return n
}

// logWarnings logs the first warnings and errors of logs, and how many.
func logWarnings(t *testing.T, logs *testlog.Buffer) {
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			if n++; n <= 4 {
				t.Logf("log: %s", line)
			}
		}
	}
	t.Logf("%d warnings and errors logged", n)
}

// TestConsumerBackendsTerminated: a DBA terminates every backend of the
// consumer's pool, every 100ms 15 times, while it applies 300 events:
// nothing is lost, nothing applied twice, nothing dead-lettered, and the
// consumer gets to the end by itself.
func TestConsumerBackendsTerminated(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	admin := testdb.Pool(t, schema, 1)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 2)
	evs := newEvents(t, 300, 12)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	app := kafkatest.Name("cons")
	inst, logs := sessionConsumer(t, kc, b, schema, group, topic, map[string]string{"application_name": app},
		func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
			time.Sleep(time.Millisecond) // a batch takes a while
			return b.effect(ctx, tx, "billing", e)
		})
	var (
		killed atomic.Int64
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	wg.Go(func() {
		for range 15 {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			killed.Add(int64(terminateApp(t, admin, app)))
		}
	})
	waitFor(t, 90*time.Second, "the partitions committed to their end", func() bool { return allCommitted(t, kc, group, topic) })
	close(stop)
	wg.Wait()
	mustStop(t, inst)
	s := inst.stats.get()
	t.Logf("%d backends terminated; stats: %d batches, %d applied, %d duplicates, %d failures, %d rewound, %d dead-lettered",
		killed.Load(), s.batches, s.applied, s.duplicates, s.failures, s.rewound, s.dead)
	if killed.Load() == 0 {
		t.Fatal("no backend terminated")
	}
	mustOnce(t, b, "billing", evs)
	if s.dead != 0 {
		t.Errorf("%d records dead-lettered; want none", s.dead)
	}
	if n := kc.EndOffsets(t, topic+idemkafka.DeadLetterSuffix)[0]; n != 0 {
		t.Errorf("dead-letter topic holds %d records; want 0", n)
	}
	logWarnings(t, logs)
}

// TestConsumerIdleInTransactionTimeout: the role's
// idle_in_transaction_session_timeout (500ms) ends the consumer's session
// while a handler is slow (1s, outside the database, between two of its
// statements, on its first three tries): its next statement fails with
// 25P03. The session's end is the database's doing, as a terminated
// backend's (57P01) is, and as the "conn closed" of every statement after
// it is: the record was retried as at fault and dead-lettered after
// Retry.Attempts (3). Nothing is dead-lettered, and every event is
// applied once.
func TestConsumerIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 20, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	var slow atomic.Int64
	inst, logs := sessionConsumer(t, kc, b, schema, group, topic, map[string]string{"idle_in_transaction_session_timeout": "500ms"},
		func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
			if err := b.effect(ctx, tx, "billing", e); err != nil {
				return err
			}
			if mustN(t, e) == 5 && slow.Add(1) <= 3 {
				time.Sleep(time.Second) // idle in the transaction: a slow call elsewhere
				// Its result written: the server ended the session.
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
					return err
				}
			}
			return nil
		})
	waitFor(t, 90*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	s := inst.stats.get()
	t.Logf("stats: %d batches, %d applied, %d duplicates, %d failures, %d rewound, %d dead-lettered",
		s.batches, s.applied, s.duplicates, s.failures, s.rewound, s.dead)
	logWarnings(t, logs)
	if s.dead != 0 {
		t.Errorf("%d records dead-lettered; want none", s.dead)
	}
	mustOnce(t, b, "billing", evs)
}

// TestRelayBackendsTerminated: a DBA terminates every backend of the
// outbox relay's pool, every 100ms 15 times, while it publishes 300
// events (its claims hold their transactions open while a batch is
// published): the relay gets every event out by itself, the log holds
// each at least once, and the consumer applies each once, in key order.
func TestRelayBackendsTerminated(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	admin := testdb.Pool(t, schema, 1)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 3)
	ctx := t.Context()
	evs := newEvents(t, 300, 12)
	enq := b.open(t)
	enqueue(t, enq, evs...)

	app := kafkatest.Name("relay")
	drv, err := pgdriver.New(testdb.PoolParams(t, schema, 4, map[string]string{"application_name": app}), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	slowPub := outbox.PublisherFunc(func(ctx context.Context, events []event.Envelope) error {
		time.Sleep(20 * time.Millisecond) // the claim's transaction stays open meanwhile
		return pub.Publish(ctx, events)
	})
	logs := &testlog.Buffer{}
	relay, err := outbox.NewRelay[pgx.Tx](drv, slowPub, &outbox.RelayConfig{
		BatchSize: 20, PollInterval: 50 * time.Millisecond,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()

	var killed atomic.Int64
	for range 15 {
		time.Sleep(100 * time.Millisecond)
		killed.Add(int64(terminateApp(t, admin, app)))
	}
	waitFor(t, 60*time.Second, "every event published", func() bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	stopRelay()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	inLog := len(kc.Records(t, topic))
	t.Logf("%d backends terminated; the log holds %d records for %d events", killed.Load(), inLog, len(evs))
	logWarnings(t, logs)
	if killed.Load() == 0 {
		t.Fatal("no backend terminated")
	}
	if inLog < len(evs) {
		t.Fatalf("the log holds %d records; want every event at least once (%d)", inLog, len(evs))
	}
	group := kafkatest.Name("g")
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the log consumed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	mustKeyOrder(t, b.rows(t, "billing"))
}
