package app

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
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
	// ConsumerSessionTimeout is the default of the consumers' group
	// session timeout (-kafka-session-timeout): the partitions of a
	// replica that died move to the others after it.
	ConsumerSessionTimeout = 6 * time.Second
	// MinSessionTimeout and MaxSessionTimeout bound
	// -kafka-session-timeout: Kafka's default group.max.session.timeout.ms
	// is 30 minutes (its minimum, 6 s, is the brokers' to enforce).
	MinSessionTimeout = time.Second
	MaxSessionTimeout = 30 * time.Minute
	// maxHeartbeat bounds the consumers' heartbeat interval: a member
	// learns of a rebalance at its next heartbeat, and the rebalance
	// waits for it (ConsumerRebalanceTimeout).
	maxHeartbeat = time.Second
	// ConsumerRebalanceTimeout bounds how long a rebalance waits for its
	// members to rejoin (a dead one included).
	ConsumerRebalanceTimeout = 10 * time.Second
	// ConsumerFetchMaxWait is how long the consumers' fetches wait for
	// records of idle partitions (idemkafka's default; kgo's is 5 s): the
	// partitions a rebalance adds (a replica died or left) are fetched
	// only once the fetch in flight returns.
	ConsumerFetchMaxWait = idemkafka.DefaultFetchMaxWait
)

// pipeline sets up the order events' way to the projection: the embedded
// broker if configured, the relay (outbox -> Kafka) and the consumer
// (Kafka -> inbox -> projection). Serve runs them. On error it closes
// what it started (but not the database).
func pipeline[TTx any](ctx context.Context, a *App, drv driver.Driver[TTx], st stores[TTx]) error {
	var (
		seeds []string
		// clientOpts are the TLS and SASL options of every client of
		// a real cluster (none for the embedded broker).
		clientOpts []kgo.Opt
		extra      = []kgo.Opt{ // of the consumers
			// A replica that dies loses its partitions to the others
			// within the session timeout (kgo's default is 45 s).
			kgo.SessionTimeout(a.cfg.KafkaSessionTimeout),
			kgo.HeartbeatInterval(min(a.cfg.KafkaSessionTimeout/6, maxHeartbeat)),
			// A member that dies during a rebalance is waited for up to
			// the rebalance timeout (kgo's default is 60 s, during which
			// the whole group stops): batches are short, so 10 s.
			kgo.RebalanceTimeout(ConsumerRebalanceTimeout),
			// Fetches wait ConsumerFetchMaxWait, idemkafka's default:
			// a dead replica's partitions are fetched at once (and the
			// embedded broker, restored from its log, may not wake a
			// waiting fetch on new records).
		}
	)
	var broker *embeddedBroker
	switch a.cfg.Kafka.Mode {
	case KafkaOff:
		a.kafka = KafkaOff
		return nil
	case KafkaEmbedded:
		var err error
		broker, err = startEmbedded(ctx, a, drv, st.identity)
		if err != nil {
			return err
		}
		seeds = broker.cluster.ListenAddrs()
		a.kafka = KafkaEmbedded + " (" + strings.Join(seeds, ",") + ", log " + broker.dir + ")"
		a.started = []any{"kafka", "embedded", "addr", strings.Join(seeds, ","), "log", broker.dir,
			"new_log", broker.fresh, "topic", a.cfg.KafkaTopic, "partitions", EmbeddedPartitions}
		closeDB := a.close
		a.close = func() {
			broker.close()
			closeDB()
		}
	default:
		seeds = a.cfg.Kafka.Seeds()
		auth := a.cfg.KafkaAuth
		var err error
		if clientOpts, err = auth.kgoOpts(kafkaDialTimeout); err != nil {
			return &ConfigError{msg: "kafka " + a.cfg.Kafka.String() + ": " + errMessage(err)}
		}
		if auth.SASL == SASLPlain && !auth.TLS {
			a.log.Warn("kafka: SASL PLAIN without TLS sends the password in clear to the brokers; set -kafka-tls (or use scram-sha-256/512)",
				"sasl_user", auth.SASLUser)
		}
		if err := checkKafka(ctx, a, seeds, a.cfg.KafkaTopic); err != nil {
			return err
		}
		a.kafka = a.cfg.Kafka.String()
		a.started = append([]any{"kafka", a.kafka, "topic", a.cfg.KafkaTopic}, auth.logAttrs()...)
		// Every client of the cluster authenticates the same way.
		extra = slices.Concat(clientOpts, extra)
	}
	a.kafkaSeeds = seeds

	pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{
		Seeds:        seeds,
		DefaultTopic: a.cfg.KafkaTopic,
		HeaderFormat: a.cfg.KafkaHeaders,
		Source:       a.cfg.KafkaSource,
		Logger:       a.log,
		ExtraOpts:    clientOpts,
	})
	if err != nil {
		return err
	}
	closeRest := a.close
	a.close = func() { pub.Close(); closeRest() }
	onPark := func(e event.Envelope, attempts int, err error) {
		a.metrics.park(e, attempts, err)
		a.parked.parked() // the gauge of parked events, now
	}
	relayCfg := outbox.RelayConfig{Logger: a.log, OnLag: a.metrics.lag, OnPark: onPark, OnLease: a.metrics.relayLease, Tracer: a.tracer}
	var relayPub outbox.Publisher = pub
	if broker != nil {
		// Into the embedded broker only while its lease surely holds.
		relayPub = newFencedPublisher(pub, broker.lease)
	}
	flusher, err := outbox.NewRelay(drv, relayPub, &relayCfg)
	if err != nil {
		return err
	}
	a.flush = func(ctx context.Context) (int, error) {
		if broker != nil && !broker.adopted.Load() {
			// A new log the outbox was not redriven into yet: the
			// next start redrives and publishes.
			return 0, nil
		}
		return flusher.RunOnce(ctx)
	}
	a.relay = func(ctx context.Context) error {
		// A new embedded log first gets the outbox again; a failure
		// (the database) is retried, the relay waits for it.
		for wait := time.Second; broker != nil; wait = min(2*wait, 30*time.Second) {
			err := broker.adopt(ctx, a, func(ctx context.Context) (int, error) {
				return outbox.Redrive(ctx, drv, outbox.RedriveOptions{})
			})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil //nolint:nilerr // stopped: redriven again at the next start
			}
			a.log.Error("embedded broker: republishing the outbox failed; retrying", "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
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
		relay, err := outbox.NewRelay(drv, relayPub, &cfg)
		if err != nil {
			return err
		}
		return relay.Run(ctx)
	}

	in, err := inbox.New(drv, &inbox.Config{Consumer: ProjectionInbox, Logger: a.log, Tracer: a.tracer})
	if err != nil {
		return err
	}
	consumer, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[TTx]{
		Seeds:  seeds,
		Group:  ProjectionGroup,
		Topics: []string{a.cfg.KafkaTopic},
		// One delta per customer per partition batch, applied in
		// ascending customer ID order: replicas consuming other
		// partitions lock the summary rows in the same order, so their
		// transactions never deadlock. (BatchHandler replaces Handler:
		// a failing batch is retried one event at a time.)
		BatchHandler: orders.ProjectionBatch(st.orders),
		InstanceID:   a.cfg.KafkaInstanceID,
		Logger:       a.log,
		OnBatch:      func(_ context.Context, s idemkafka.BatchStats) { a.metrics.batch(ProjectionInbox, s) },
		ExtraOpts:    extra,
	})
	if err != nil {
		return err
	}
	a.consume = consumer.Run
	a.metrics.stalled.use(ProjectionInbox, consumer.Stalled)
	a.metrics.resets.use(ProjectionInbox, consumer.OffsetResets)
	// The consumer groups' lag, measured by a client of its own (no
	// group) at a steady pace, whatever the scrapes.
	admin, err := kgo.NewClient(append(slices.Clone(clientOpts), kgo.SeedBrokers(seeds...))...)
	if err != nil {
		return err
	}
	closeMore := a.close
	a.close = func() { admin.Close(); closeMore() }
	lc := &lagChecker{adm: kadm.NewClient(admin), topic: a.cfg.KafkaTopic, groups: []string{ProjectionGroup, SagaGroup}, m: a.metrics, log: a.log}
	a.lagCheck = lc.run
	return sagaConsumer(a, drv, st, seeds, extra)
}

// sagaConsumer sets up the order payment saga: a second consumer of the
// topic (inbox SagaInbox, group SagaGroup) whose handler runs the saga's
// steps in the inbox's transaction, and its compensator, which compensates
// the sagas the handler aborted once their transaction committed.
func sagaConsumer[TTx any](a *App, drv driver.Driver[TTx], st stores[TTx], seeds []string, extra []kgo.Opt) error {
	sagas, err := saga.New(drv, &saga.Config{Logger: a.log, Tracer: a.tracer})
	if err != nil {
		return err
	}
	ps := orders.NewPaymentSaga(sagas, st.orders, st.payments, a.log)
	in, err := inbox.New(drv, &inbox.Config{Consumer: SagaInbox, Logger: a.log, Tracer: a.tracer})
	if err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	consumer, err := idemkafka.NewConsumer(in, &idemkafka.ConsumerConfig[TTx]{
		Seeds:      seeds,
		Group:      SagaGroup,
		Topics:     []string{a.cfg.KafkaTopic},
		Handler:    ps.Handle,
		InstanceID: a.cfg.KafkaInstanceID,
		Logger:     a.log,
		// After the batch's transaction committed: the relay publishes
		// the events its steps emitted, and the compensator compensates
		// the sagas it aborted.
		OnBatch: func(_ context.Context, s idemkafka.BatchStats) {
			a.metrics.batch(SagaInbox, s)
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
	a.metrics.stalled.use(SagaInbox, consumer.Stalled)
	a.metrics.resets.use(SagaInbox, consumer.OffsetResets)
	redriveFor := WatchdogRedriveFor
	if a.cfg.Cleanup == CleanupOff {
		redriveFor = 0 // the inboxes forget nothing
	}
	wd, err := orders.NewWatchdog(drv, ps, st.stale, orders.WatchdogConfig{
		StuckAfter:  a.cfg.SagaStuckAfter,
		GiveUpAfter: a.cfg.SagaGiveUpAfter,
		RedriveFor:  redriveFor,
		OnRound: func(s orders.WatchdogStats) {
			a.metrics.watchdog(s)
			if s.Redriven > 0 || s.Aborted > 0 {
				select { // publish now, not at the next poll
				case a.enqueued <- struct{}{}:
				default:
				}
			}
			if s.Aborted > 0 {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		},
	}, a.log)
	if err != nil {
		return err
	}
	a.watchdog = wd.Run
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
