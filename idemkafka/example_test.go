package idemkafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

// A projection that applies each OrderCreated event once, in PostgreSQL.
// Every replica runs the same code: one consumer group, one inbox name.
func ExampleNewConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	drv, err := pgdriver.New(pool, &pgdriver.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// idem's tables (processed_event, outbox, ...): without them every
	// batch fails with "relation ... does not exist".
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(drv, &inbox.Config{Consumer: "order-projection"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[pgx.Tx]{
		Seeds: []string{"localhost:9092"},
		// Group: the inbox's consumer name, "order-projection", by default.
		// Create "orders" and "orders.dlq" first (or let the cluster create
		// topics on demand): failures go to "orders.dlq".
		Topics: []string{"orders"},
		Handler: func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
			// The effect, in the inbox's transaction: it commits with the
			// event's processed_event row, before the offset.
			_, err := tx.Exec(ctx, `INSERT INTO order_view (order_id, body) VALUES ($1, $2)`, e.Key, e.Payload)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Until Ctrl-C: then the batch in flight commits and the group is left.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The same projection with a batch handler: each partition batch's new
// events are written with ONE statement (a multi-row INSERT over unnest)
// instead of one INSERT per event, in the inbox's transaction. A record
// whose effect fails makes the consumer apply the batch one record at a
// time, so only that record is retried and dead-lettered.
func ExampleNewConsumer_batchHandler() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	drv, err := pgdriver.New(pool, &pgdriver.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// idem's tables (processed_event, outbox, ...): without them every
	// batch fails with "relation ... does not exist".
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(drv, &inbox.Config{Consumer: "order-projection"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[pgx.Tx]{
		Seeds:  []string{"localhost:9092"},
		Topics: []string{"orders"},
		BatchHandler: func(ctx context.Context, tx pgx.Tx, events []event.Envelope) error {
			// events are the batch's new events, duplicates removed, in
			// offset order.
			ids := make([]string, len(events))
			bodies := make([]string, len(events))
			for i, e := range events {
				ids[i], bodies[i] = e.Key, string(e.Payload)
			}
			_, err := tx.Exec(ctx, `INSERT INTO order_view (order_id, body)
				SELECT * FROM unnest($1::text[], $2::jsonb[])`, ids, bodies)
			return err
		},
		MaxPollRecords: 1000, // bigger batches, fewer statements
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The outbox relay publishing to Kafka with the idempotent producer.
func ExampleNewPublisher() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	drv, err := pgdriver.New(pool, &pgdriver.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// idem's tables (processed_event, outbox, ...): without them every
	// batch fails with "relation ... does not exist".
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{
		Seeds:        []string{"localhost:9092"},
		DefaultTopic: "orders", // must exist: see PublisherConfig.DefaultTopic
	})
	if err != nil {
		log.Fatal(err) // for instance ErrNotIdempotent
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A record in the CloudEvents Kafka binding's binary mode, readable by any
// CloudEvents consumer; idemkafka's consumer reads it as well.
func ExampleRecordWith() {
	e := event.Envelope{
		ID:         uuid.MustParse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f"),
		Type:       "OrderCreated.v1",
		Key:        "order-42",
		OccurredAt: time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC),
		Payload:    []byte(`{"orderId":"order-42"}`),
	}
	// A Publisher does the same with PublisherConfig.HeaderFormat and Source.
	r, err := idemkafka.RecordWith("orders", e, event.HeaderOptions{Format: event.HeaderFormatCloudEvents, Source: "/orders-service"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("key %s, value %s\n", r.Key, r.Value)
	for _, h := range r.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	back, err := idemkafka.Envelope(r)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("decoded:", back.ID, back.Type, back.OccurredAt)
	// Output:
	// key order-42, value {"orderId":"order-42"}
	// ce_specversion: 1.0
	// ce_id: 017f22e2-79b0-7cc3-98c4-dc0c0c07398f
	// ce_source: /orders-service
	// ce_type: OrderCreated.v1
	// ce_subject: order-42
	// ce_time: 2022-02-22T19:22:22Z
	// ce_partitionkey: order-42
	// content-type: application/json
	// decoded: 017f22e2-79b0-7cc3-98c4-dc0c0c07398f OrderCreated.v1 2022-02-22 19:22:22 +0000 UTC
}

// Refusing to start when a topic is missing: the consumer's topics and
// their dead-letter topics, asked of the brokers once, at start-up.
func ExampleCheckTopics() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &idemkafka.ConsumerConfig[pgx.Tx]{
		Seeds:  []string{"localhost:9092"},
		Topics: []string{"orders"},
		// Handler, ...
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Seeds...))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	err = idemkafka.CheckTopics(ctx, cl, cfg.RequiredTopics()...) // orders, orders.dlq
	var te *idemkafka.TopicsError
	switch {
	case errors.As(err, &te):
		// Topics missing (te.Missing), or hidden by an ACL
		// (te.Unauthorized): "idemkafka: the brokers do not have the
		// topics orders.dlq: create them, or enable auto-creation (...)"
		log.Fatal(err)
	case err != nil:
		// Unreachable (or refusing the client): the consumer waits for
		// the brokers; starting anyway is a choice.
		log.Printf("kafka not checked: %v", err)
	}
}

// The whole path without a Kafka of your own, for development and tests: an
// order's event enqueued in its transaction (SQLite here), a relay
// publishing it with the idempotent producer to an in-process kfake broker,
// a redrive publishing it a second time, and a consumer applying it once
// through the inbox. In production Seeds name your brokers.
func Example_inProcessBroker() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, _ := os.MkdirTemp("", "idem-kafka-example")
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE order_view (order_id TEXT PRIMARY KEY, body TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	// The broker, with the topic and its dead-letter topic: neither the
	// publisher nor the consumer creates them.
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "orders.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	seeds := broker.ListenAddrs()

	// The business transaction: the order (elided) and its event.
	tx, err := drv.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	e, err := event.New("OrderCreated.v1", "order-42", map[string]string{"amount": "99.9000"})
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.EnqueueTx(ctx, drv, tx, e); err != nil {
		log.Fatal(err)
	}
	if err := drv.Commit(ctx, tx); err != nil {
		log.Fatal(err)
	}

	// The relay (usually go relay.Run(ctx) for the process's life).
	pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(drv, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.RunOnce(ctx)
	fmt.Println("published:", n, err)
	// The same event again, with its ID: what a relay that died between
	// the publish and the mark does (here outbox.Redrive).
	if _, err := outbox.Redrive(ctx, drv, outbox.RedriveOptions{}); err != nil {
		log.Fatal(err)
	}
	n, err = relay.RunOnce(ctx)
	fmt.Println("published again:", n, err)

	// The consumer: group "order-projection", from the start of the topic.
	in, err := inbox.New(drv, &inbox.Config{Consumer: "order-projection"})
	if err != nil {
		log.Fatal(err)
	}
	batches := make(chan idemkafka.BatchStats, 16)
	c, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[*sql.Tx]{
		Seeds:  seeds,
		Topics: []string{"orders"},
		Handler: func(ctx context.Context, tx *sql.Tx, e event.Envelope) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO order_view (order_id, body) VALUES (?, ?)`, e.Key, string(e.Payload))
			return err
		},
		OnBatch: func(_ context.Context, s idemkafka.BatchStats) { batches <- s },
	})
	if err != nil {
		log.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	var records, applied, duplicates int
	for records < 2 {
		select {
		case s := <-batches:
			records, applied, duplicates = records+s.Records, applied+s.Applied, duplicates+s.Duplicates
		case <-time.After(30 * time.Second):
			log.Fatal("no batch within 30s")
		}
	}
	cancel() // the consumer commits its offsets and leaves the group
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}
	fmt.Printf("consumed: %d records, %d applied, %d duplicate\n", records, applied, duplicates)
	var body string
	if err := drv.DB().QueryRow(`SELECT body FROM order_view WHERE order_id = 'order-42'`).Scan(&body); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order_view:", body)
	// Output:
	// published: 1 <nil>
	// published again: 1 <nil>
	// consumed: 2 records, 1 applied, 1 duplicate
	// order_view: {"amount":"99.9000"}
}
