package app

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/saga"
)

// Names of the order projection's consumer.
const (
	// ProjectionInbox is the inbox consumer name of the projection.
	ProjectionInbox = "order-projection"
	// ProjectionGroup is its Kafka consumer group.
	ProjectionGroup = "idemd-order-projection"
	// SagaInbox is the inbox consumer name of the order payment saga.
	SagaInbox = "order-saga"
	// SagaGroup is its Kafka consumer group.
	SagaGroup = "idemd-order-saga"
	// SagaRecoverInterval is how often the saga's compensator looks for
	// aborted (or interrupted) sagas besides after each batch.
	SagaRecoverInterval = 5 * time.Second
	// EmbeddedPartitions is the partition count of the topic the embedded
	// broker creates.
	EmbeddedPartitions = 3
)

// pipeline sets up the order events' way to the projection: the embedded
// broker if configured, the relay (outbox -> Kafka) and the consumer
// (Kafka -> inbox -> projection). Serve runs them. On error it closes
// what it started (but not the database).
func pipeline[TTx any](a *App, drv driver.Driver[TTx], st stores[TTx]) error {
	var (
		seeds []string
		extra []kgo.Opt // of the consumer
	)
	switch a.cfg.Kafka.Mode {
	case KafkaOff:
		a.kafka = KafkaOff
		return nil
	case KafkaEmbedded:
		opts := []kfake.Opt{
			kfake.NumBrokers(1),
			kfake.SeedTopics(EmbeddedPartitions, a.cfg.KafkaTopic),
			kfake.SeedTopics(1, a.cfg.KafkaTopic+idemkafka.DeadLetterSuffix),
		}
		if a.cfg.DB.Kind == SQLite {
			// The broker's log survives a restart, so events published
			// but not yet consumed are not lost with it.
			opts = append(opts, kfake.DataDir(a.cfg.DB.Path+".kafka"))
		}
		broker, err := kfake.NewCluster(opts...)
		if err != nil {
			return fmt.Errorf("start the embedded broker: %w", err)
		}
		seeds = broker.ListenAddrs()
		a.kafka = KafkaEmbedded + " (" + strings.Join(seeds, ",") + ")"
		dir := "memory"
		if a.cfg.DB.Kind == SQLite {
			dir = filepath.Clean(a.cfg.DB.Path + ".kafka")
		}
		a.started = []any{"kafka", "embedded", "addr", strings.Join(seeds, ","), "log", dir,
			"topic", a.cfg.KafkaTopic, "partitions", EmbeddedPartitions}
		// A broker restored from its log may not wake a waiting fetch
		// on new records: poll it often (it is in-process).
		extra = append(extra, kgo.FetchMaxWait(500*time.Millisecond))
		closeDB := a.close
		a.close = func() { broker.Close(); closeDB() }
	default:
		seeds = a.cfg.Kafka.Seeds()
		a.kafka = a.cfg.Kafka.String()
		a.started = []any{"kafka", a.kafka, "topic", a.cfg.KafkaTopic}
	}

	pub, err := idemkafka.NewPublisher(idemkafka.PublisherConfig{
		Seeds:        seeds,
		DefaultTopic: a.cfg.KafkaTopic,
		Logger:       a.log,
	})
	if err != nil {
		return err
	}
	closeRest := a.close
	a.close = func() { pub.Close(); closeRest() }
	relayCfg := outbox.RelayConfig{Logger: a.log, OnLag: a.metrics.lag}
	if _, err := outbox.NewRelay(drv, pub, &relayCfg); err != nil {
		return err
	}
	a.relay = func(ctx context.Context) error {
		cfg := relayCfg
		cfg.Wake = a.enqueued // this process's orders
		if st.wake != nil {   // every replica's orders
			wake, err := st.wake(ctx)
			if err == nil {
				cfg.Wake = wake
			} else {
				a.log.Warn("outbox relay: no LISTEN wake-ups, this process's only", "err", err)
			}
		}
		relay, err := outbox.NewRelay(drv, pub, &cfg)
		if err != nil {
			return err
		}
		return relay.Run(ctx)
	}

	in, err := inbox.New(drv, &inbox.Config{Consumer: ProjectionInbox, Logger: a.log})
	if err != nil {
		return err
	}
	consumer, err := idemkafka.NewConsumer(drv, in, idemkafka.ConsumerConfig[TTx]{
		Seeds:     seeds,
		Group:     ProjectionGroup,
		Topics:    []string{a.cfg.KafkaTopic},
		Handler:   orders.Projection(st.orders),
		Logger:    a.log,
		OnBatch:   a.metrics.batch,
		ExtraOpts: extra,
	})
	if err != nil {
		return err
	}
	a.consume = consumer.Run
	return sagaConsumer(a, drv, st, seeds, extra)
}

// sagaConsumer sets up the order payment saga: a second consumer of the
// topic (inbox SagaInbox, group SagaGroup) whose handler runs the saga's
// steps in the inbox's transaction, and its compensator, which compensates
// the sagas the handler aborted once their transaction committed.
func sagaConsumer[TTx any](a *App, drv driver.Driver[TTx], st stores[TTx], seeds []string, extra []kgo.Opt) error {
	sagas, err := saga.New(drv, &saga.Config{Logger: a.log})
	if err != nil {
		return err
	}
	ps := orders.NewPaymentSaga(sagas, st.orders, st.payments, a.log)
	in, err := inbox.New(drv, &inbox.Config{Consumer: SagaInbox, Logger: a.log})
	if err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	consumer, err := idemkafka.NewConsumer(drv, in, idemkafka.ConsumerConfig[TTx]{
		Seeds:   seeds,
		Group:   SagaGroup,
		Topics:  []string{a.cfg.KafkaTopic},
		Handler: ps.Handle,
		Logger:  a.log,
		// After the batch's transaction committed: the relay publishes
		// the events its steps emitted, and the compensator compensates
		// the sagas it aborted.
		OnBatch: func(_ context.Context, s idemkafka.BatchStats) {
			if s.Applied == 0 {
				return
			}
			for _, c := range []chan struct{}{a.enqueued, wake} {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		},
		ExtraOpts: extra,
	})
	if err != nil {
		return err
	}
	a.saga = func(ctx context.Context) error {
		cctx, cancel := context.WithCancel(ctx)
		compensated := make(chan struct{})
		go func() {
			defer close(compensated)
			_ = ps.RunCompensator(cctx, wake, SagaRecoverInterval)
		}()
		err := consumer.Run(ctx)
		cancel()
		<-compensated
		return err
	}
	return nil
}

// Kafka describes the Kafka in use: "off", "embedded (127.0.0.1:PORT...)"
// or the seed brokers.
func (a *App) Kafka() string { return a.kafka }
