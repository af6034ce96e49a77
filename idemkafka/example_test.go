package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver/pgdriver"
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
