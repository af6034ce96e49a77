package idemkafka_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// fastRetry makes kgo retry a failed produce after 10ms instead of its
// default backoff.
var fastRetry = kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })

func newPublisher(t *testing.T, cfg idemkafka.PublisherConfig) *idemkafka.Publisher {
	t.Helper()
	p, err := idemkafka.NewPublisher(&cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Options that make the producer non-idempotent, lower acks, add
// transactions, redirect every record to one topic or wait for a manual
// Flush are refused, for the publisher and for the consumer's
// dead-letter producer.
func TestOptionsRejected(t *testing.T) {
	t.Parallel()
	seeds := []string{"127.0.0.1:1"} // never dialled: construction does no I/O
	b := setupSQLite(t)
	drv := b.open(t)
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		opts []kgo.Opt
		want error
	}{
		{"DisableIdempotentWrite", []kgo.Opt{kgo.DisableIdempotentWrite()}, idemkafka.ErrNotIdempotent},
		{"LeaderAck without idempotence", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}, idemkafka.ErrNotIdempotent},
		{"LeaderAck", []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}, idemkafka.ErrNotIdempotent},
		{"NoAck", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.NoAck())}, idemkafka.ErrNotIdempotent},
		{"AllowIdempotentProduceCancellation", []kgo.Opt{kgo.AllowIdempotentProduceCancellation()}, idemkafka.ErrNotIdempotent},
		{"TransactionalID", []kgo.Opt{kgo.TransactionalID("relay")}, idemkafka.ErrUnsupportedOption},
		// Every dead letter would go to "orders", the consumed topic: the
		// consumer dead-lettered its own copies for ever.
		{"DefaultProduceTopicAlways", []kgo.Opt{kgo.DefaultProduceTopic("orders"), kgo.DefaultProduceTopicAlways()}, idemkafka.ErrUnsupportedOption},
		// Without a DefaultProduceTopic, kgo's own error ("invalid empty
		// DefaultProduceTopic when using DefaultProduceTopicAlways") was
		// returned: not ErrUnsupportedOption, though a DefaultProduceTopic
		// would not have made the option acceptable.
		{"DefaultProduceTopicAlways without DefaultProduceTopic", []kgo.Opt{kgo.DefaultProduceTopicAlways()}, idemkafka.ErrUnsupportedOption},
		// Dead letters sat in the client's buffer, never sent.
		{"ManualFlushing", []kgo.Opt{kgo.ManualFlushing()}, idemkafka.ErrUnsupportedOption},
	}
	for _, tc := range cases {
		t.Run("publisher/"+tc.name, func(t *testing.T) {
			_, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders", ExtraOpts: tc.opts})
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewPublisher = %v; want %v", err, tc.want)
			}
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, tc.opts...)...)
			if err != nil {
				return // kgo refuses it already
			}
			defer cl.Close()
			if _, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Client: cl, DefaultTopic: "orders"}); !errors.Is(err, tc.want) {
				t.Fatalf("NewPublisher with the client = %v; want %v", err, tc.want)
			}
		})
		t.Run("consumer/"+tc.name, func(t *testing.T) {
			cfg := consumerConfigAt(seeds, b, "billing", "g", nil, "orders")
			cfg.ExtraOpts = tc.opts
			_, err := idemkafka.NewConsumer(in, &cfg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewConsumer = %v; want %v", err, tc.want)
			}
		})
	}

	// Each option the consumer cannot honour is refused with
	// ErrUnsupportedOption, named in the error.
	partitions := kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"orders": {0: kgo.NewOffset()}})
	for _, tc := range []struct {
		name       string
		instanceID string
		opts       []kgo.Opt
		want       string // in the error
	}{
		{"ConsumeRegex", "", []kgo.Opt{kgo.ConsumeRegex()}, "ConsumeRegex"},
		// kgo refuses direct partitions in a group with an error of its
		// own: that was returned, not ErrUnsupportedOption.
		{"ConsumePartitions", "", []kgo.Opt{partitions}, "ConsumePartitions"},
		{"ConsumePartitions with a group", "", []kgo.Opt{kgo.ConsumerGroup("other"), partitions}, "ConsumePartitions"},
		// A transactional producer's commit marker was polled as a
		// record and dead-lettered as "not an idem event".
		{"KeepControlRecords", "", []kgo.Opt{kgo.KeepControlRecords()}, "KeepControlRecords"},
		{"ServerSideBalancer with InstanceID", "pod-0", []kgo.Opt{kgo.ServerSideBalancer()}, "ServerSideBalancer"},
		{"ServerSideBalancer with kgo.InstanceID", "", []kgo.Opt{kgo.InstanceID("pod-0"), kgo.ServerSideBalancer()}, "ServerSideBalancer"},
		// A share group (KIP-932) has no offsets to commit after the
		// transaction: kgo's own conflict with the consumer's group was
		// returned, not ErrUnsupportedOption.
		{"ShareGroup", "", []kgo.Opt{kgo.ShareGroup("billing")}, "ShareGroup"},
		{"ShareGroup with its options", "", []kgo.Opt{kgo.ShareGroup("billing"), kgo.ShareMaxRecords(10), kgo.ShareAckCallback(func(*kgo.Client, kgo.ShareAckResults) {})}, "ShareGroup"},
		{"ShareGroup and ConsumePartitions", "", []kgo.Opt{kgo.ShareGroup("billing"), partitions}, "ShareGroup"},
		{"ConsumePartitions and ShareGroup", "", []kgo.Opt{kgo.ShareGroup("billing"), partitions}, "ConsumePartitions"},
	} {
		cfg := consumerConfigAt(seeds, b, "billing", "g", nil, "orders")
		cfg.InstanceID = tc.instanceID
		cfg.ExtraOpts = tc.opts
		_, err := idemkafka.NewConsumer(in, &cfg)
		if !errors.Is(err, idemkafka.ErrUnsupportedOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewConsumer with %s = %v; want %v naming %s", tc.name, err, idemkafka.ErrUnsupportedOption, tc.want)
		}
	}
	// kgo's own refusals are still returned as such.
	cfg := consumerConfigAt(seeds, b, "billing", "g", nil, "orders")
	cfg.ExtraOpts = []kgo.Opt{kgo.SessionTimeout(time.Millisecond)}
	if _, err := idemkafka.NewConsumer(in, &cfg); err == nil || errors.Is(err, idemkafka.ErrUnsupportedOption) || !strings.Contains(err.Error(), "session timeout") {
		t.Errorf("NewConsumer with a session timeout kgo refuses = %v; want kgo's error", err)
	}

	// The defaults pass, with and without a client of the caller's.
	newPublisher(t, idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: "orders"})
	cfg = consumerConfigAt(seeds, b, "billing", "g", nil, "orders")
	if _, err := idemkafka.NewConsumer(in, &cfg); err != nil {
		t.Errorf("NewConsumer with the test options: %v", err)
	}
}

// The broker appends a batch, then answers with a retriable error that
// leaves the outcome unknown (a replica timeout), and the producer sends
// the batch again. The idempotent publisher leaves one record per event;
// the same records produced with idempotence disabled (built directly with
// kgo, since NewPublisher refuses it) are duplicated in the log, and only
// the consumer's inbox saves the effects.
func TestPublishRetryAfterAppend(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.RequestTimedOut, kerr.NotEnoughReplicasAfterAppend} {
		t.Run(code.Message+"/idempotent", func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.New(t)
			fake := kc.Fake(t)
			topic := kc.Topic(t, "orders", 3)
			p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: []kgo.Opt{fastRetry}})
			evs := newEvents(t, 9, 3)

			fault := fake.Fault(kfakeFault(kmsg.Produce, topic, code, 3))
			if err := p.Publish(t.Context(), evs); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			if fault.Hits() == 0 {
				t.Fatal("the fault never hit")
			}
			got := kc.Records(t, topic)
			if len(got) != len(evs) {
				t.Fatalf("log holds %d records for %d events (%d faults); want one each", len(got), len(evs), fault.Hits())
			}
			mustPublished(t, got, evs)
		})
		t.Run(code.Message+"/not-idempotent", func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.New(t)
			fake := kc.Fake(t)
			topic := kc.Topic(t, "orders", 3)
			cl := kc.Client(t, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.AllISRAcks()), fastRetry)
			if _, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Client: cl, DefaultTopic: topic}); !errors.Is(err, idemkafka.ErrNotIdempotent) {
				t.Fatalf("NewPublisher accepted a non-idempotent client: %v", err)
			}
			evs := newEvents(t, 9, 3)

			fault := fake.Fault(kfakeFault(kmsg.Produce, topic, code, 3))
			if err := cl.ProduceSync(t.Context(), recordsOf(topic, evs...)...).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
			got := kc.Records(t, topic)
			if len(got) <= len(evs) {
				t.Fatalf("log holds %d records for %d events (%d faults); want duplicates without idempotence", len(got), len(evs), fault.Hits())
			}
			t.Logf("without idempotence: %d records for %d events", len(got), len(evs))

			// The inbox still applies each event once.
			b := setupSQLite(t)
			group := kafkatest.Name("g")
			inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
			waitFor(t, 30*time.Second, "the duplicated log consumed", func() bool { return allCommitted(t, kc, group, topic) })
			mustStop(t, inst)
			mustOnce(t, b, "billing", evs)
			if s := inst.stats.get(); s.duplicates != len(got)-len(evs) {
				t.Errorf("consumer skipped %d duplicates; want %d", s.duplicates, len(got)-len(evs))
			}
		})
	}
}

// mustPublished checks that rs hold evs once each, every field intact, each
// key's events in the order given, written by an idempotent producer.
func mustPublished(t *testing.T, rs []*kgo.Record, evs []event.Envelope) {
	t.Helper()
	byID := map[uuid.UUID]event.Envelope{}
	for _, e := range evs {
		byID[e.ID] = e
	}
	seen := map[uuid.UUID]bool{}
	perKey := map[string][]uuid.UUID{}
	slices.SortStableFunc(rs, func(a, b *kgo.Record) int { // partition, then offset
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	for _, r := range rs {
		got, err := idemkafka.Envelope(r)
		if err != nil {
			t.Fatalf("record %d/%d: %v", r.Partition, r.Offset, err)
		}
		want, ok := byID[got.ID]
		switch {
		case !ok:
			t.Fatalf("record of unknown event %s", got.ID)
		case seen[got.ID]:
			t.Fatalf("event %s published twice", got.ID)
		case got.Type != want.Type || got.Key != want.Key || !got.OccurredAt.Equal(want.OccurredAt) ||
			!bytes.Equal(got.Payload, want.Payload) || got.SagaID != want.SagaID || fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers):
			t.Fatalf("event %s came back as %+v; want %+v", got.ID, got, want)
		case r.ProducerID < 0:
			t.Fatalf("event %s was produced without idempotence", got.ID)
		}
		seen[got.ID] = true
		perKey[got.Key] = append(perKey[got.Key], got.ID)
	}
	if len(seen) != len(evs) {
		t.Fatalf("%d of %d events published", len(seen), len(evs))
	}
	for key, ids := range perKey {
		var want []uuid.UUID
		for _, e := range evs {
			if e.Key == key {
				want = append(want, e.ID)
			}
		}
		if !slices.Equal(ids, want) {
			t.Fatalf("key %s: published in order %v; want %v", key, ids, want)
		}
	}
}

// Events go to the topic Topic picks (or DefaultTopic), intact and in
// order per key.
func TestPublishRoundTrip(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	orders := kc.Topic(t, "orders", 4)
	audit := kc.Topic(t, "audit", 2)
	p := newPublisher(t, idemkafka.PublisherConfig{
		Seeds:        kc.Seeds,
		DefaultTopic: orders,
		Topic: func(e event.Envelope) string {
			if strings.HasSuffix(e.Key, "-0") {
				return audit
			}
			return "" // DefaultTopic
		},
	})
	evs := newEvents(t, 200, 7)
	evs[3].SagaID = "saga-1"
	evs[3].Headers = map[string]string{"traceparent": "00-abc-01", "tenant": "t1"}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	var toAudit, toOrders []event.Envelope
	for _, e := range evs {
		if strings.HasSuffix(e.Key, "-0") {
			toAudit = append(toAudit, e)
		} else {
			toOrders = append(toOrders, e)
		}
	}
	mustPublished(t, kc.Records(t, audit), toAudit)
	mustPublished(t, kc.Records(t, orders), toOrders)
	if err := p.Publish(t.Context(), nil); err != nil {
		t.Errorf("Publish(nil) = %v", err)
	}
}

// A batch published in part reports each event: published, poison (too
// large, rejected by the broker) or skipped behind an earlier failure of
// its key, so the relay marks exactly the published ones.
func TestPublishPartialFailure(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})

	evs := newEvents(t, 5, 2) // keys order-0, order-1, order-0, order-1, order-0
	big, err := event.New("OrderCreated.v1", evs[2].Key, map[string]string{"pad": strings.Repeat("x", 2<<20)})
	if err != nil {
		t.Fatal(err)
	}
	evs[2] = big
	err = p.Publish(t.Context(), evs)
	var pe *outbox.PublishError
	if !errors.As(err, &pe) || len(pe.Errs) != len(evs) {
		t.Fatalf("Publish = %v; want an *outbox.PublishError with %d entries", err, len(evs))
	}
	for i, check := range []func(error) bool{
		func(err error) bool { return err == nil },
		func(err error) bool { return err == nil },
		func(err error) bool { return errors.Is(err, outbox.ErrPoison) && errors.Is(err, kerr.MessageTooLarge) },
		func(err error) bool { return err == nil },                        // another key
		func(err error) bool { return errors.Is(err, outbox.ErrSkipped) }, // behind the poison of its key
	} {
		if !check(pe.Errs[i]) {
			t.Errorf("event %d (key %s): %v", i, evs[i].Key, pe.Errs[i])
		}
	}
	mustPublished(t, kc.Records(t, topic), []event.Envelope{evs[0], evs[1], evs[3]})

	if kc.Real() {
		return
	}
	// The broker refuses a batch as a whole (kgo fails each of its
	// records): each event is produced again alone, and those the broker
	// takes alone are published, not poison.
	once := newEvents(t, 3, 3)
	fault := kc.Fake(t).Fault(kfakeFault(kmsg.Produce, topic, kerr.InvalidRecord, 1))
	if err := p.Publish(t.Context(), once); err != nil || fault.Hits() != 1 {
		t.Fatalf("Publish with the broker refusing the batch once = %v (%d faults); want all published alone", err, fault.Hits())
	}
	mustPublished(t, kc.Records(t, topic)[3:], once)

	// The broker refuses every one of them, also alone: poison, nothing
	// published.
	more := newEvents(t, 3, 3)
	fault = kc.Fake(t).Fault(kfakeFault(kmsg.Produce, topic, kerr.InvalidRecord, 1000))
	err = p.Publish(t.Context(), more)
	fault.Remove()
	if !errors.As(err, &pe) {
		t.Fatalf("Publish with the broker rejecting every record = %v", err)
	}
	for i, err := range pe.Errs {
		if !errors.Is(err, outbox.ErrPoison) || !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("event %d: %v; want ErrPoison wrapping INVALID_RECORD", i, err)
		}
	}
	if n := len(kc.Records(t, topic)) - 6; n != 0 {
		t.Errorf("%d records appended, want none", n)
	}

	// A topic the producer may not write to is the operator's to fix, not
	// the events': a failure to retry, never poison (which would park the
	// head of every key for good).
	denied := newEvents(t, 2, 2)
	kc.Fake(t).Fault(kfakeFault(kmsg.Produce, topic, kerr.TopicAuthorizationFailed, 1))
	err = p.Publish(t.Context(), denied)
	if !errors.As(err, &pe) {
		t.Fatalf("Publish with the topic denied = %v", err)
	}
	for i, err := range pe.Errs {
		if errors.Is(err, outbox.ErrPoison) {
			t.Errorf("event %d with the topic denied: %v; want a failure to retry, not poison", i, err)
		}
	}
}

// Produce errors an operator fixes (the relay host's clock, the topic's
// configuration or policy) are failures to retry, never poison: as poison
// they parked the head of every key at its first attempt, for good.
func TestPublishOperatorErrorsNotPoison(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	if kc.Real() {
		t.Skip("injects broker faults")
	}
	topic := kc.Topic(t, "orders", 1)
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic})
	for _, code := range []*kerr.Error{kerr.InvalidTimestamp, kerr.PolicyViolation, kerr.UnsupportedForMessageFormat} {
		fault := kc.Fake(t).Fault(kfakeFault(kmsg.Produce, topic, code, 1))
		err := p.Publish(t.Context(), newEvents(t, 2, 2))
		fault.Remove()
		var pe *outbox.PublishError
		if !errors.As(err, &pe) {
			t.Fatalf("Publish with %s = %v; want a PublishError", code.Message, err)
		}
		for i, err := range pe.Errs {
			if errors.Is(err, outbox.ErrPoison) {
				t.Errorf("%s: event %d: %v; want a failure to retry, not poison", code.Message, i, err)
			}
		}
	}
}

// When Topic sends the events of one key to different topics, kgo produces
// to both at once: an event of the second topic was published although the
// key's earlier event, in the first, failed. Within a batch, a key's events
// after its topic changes wait for the next batch (ErrSkipped).
func TestPublishKeyAcrossTopicsKeepsOrder(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	if kc.Real() {
		t.Skip("injects broker faults")
	}
	t1, t2 := kc.Topic(t, "orders", 1), kc.Topic(t, "payments", 1)
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, Topic: func(e event.Envelope) string {
		if e.Type == "PaymentTaken.v1" {
			return t2
		}
		return t1
	}})
	created, err := event.New("OrderCreated.v1", "order-1", payload{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	paid, err := event.New("PaymentTaken.v1", "order-1", payload{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	other, err := event.New("PaymentTaken.v1", "order-2", payload{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	fault := kc.Fake(t).Fault(kfakeFault(kmsg.Produce, t1, kerr.TopicAuthorizationFailed, 1))
	err = p.Publish(t.Context(), []event.Envelope{created, paid, other})
	fault.Remove()
	var pe *outbox.PublishError
	if !errors.As(err, &pe) || len(pe.Errs) != 3 {
		t.Fatalf("Publish = %v; want a PublishError of 3 events", err)
	}
	if pe.Errs[0] == nil || errors.Is(pe.Errs[0], outbox.ErrSkipped) {
		t.Errorf("event 0 (topic denied): %v; want its failure", pe.Errs[0])
	}
	if !errors.Is(pe.Errs[1], outbox.ErrSkipped) {
		t.Errorf("event 1 (same key, other topic): %v; want ErrSkipped", pe.Errs[1])
	}
	if pe.Errs[2] != nil {
		t.Errorf("event 2 (another key): %v; want published", pe.Errs[2])
	}
	mustPublished(t, kc.Records(t, t2), []event.Envelope{other})

	// The next batch publishes the key's events in order.
	if err := p.Publish(t.Context(), []event.Envelope{created}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), []event.Envelope{paid}); err != nil {
		t.Fatal(err)
	}
	mustPublished(t, kc.Records(t, t2), []event.Envelope{other, paid})
}

// A topic that Topic picks and Kafka refuses by its name (illegal
// characters, too long) can never be written: the event is poison at once,
// as an invalid DefaultTopic is refused by NewPublisher; the other keys'
// events are published. It was tried against the broker and retried for
// ever (UNKNOWN_TOPIC_OR_PARTITION on kfake, kgo's own error for a name
// over 249 characters).
func TestPublishIllegalTopicPoison(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	for _, bad := range []string{"orders events", "orders/eu", strings.Repeat("t", 250)} {
		p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Topic: func(e event.Envelope) string {
			if e.Key == "order-0" {
				return bad
			}
			return ""
		}})
		evs := newEvents(t, 4, 2) // order-0, order-1, order-0, order-1
		start := time.Now()
		err := p.Publish(t.Context(), evs)
		var pe *outbox.PublishError
		if !errors.As(err, &pe) || len(pe.Errs) != len(evs) {
			t.Fatalf("topic %.20q: Publish = %v; want a PublishError of %d events", bad, err, len(evs))
		}
		if !errors.Is(pe.Errs[0], outbox.ErrPoison) || !strings.Contains(pe.Errs[0].Error(), "only ASCII") && !strings.Contains(pe.Errs[0].Error(), "at most 249") {
			t.Errorf("topic %.20q: event 0: %v; want ErrPoison naming the illegal topic", bad, pe.Errs[0])
		}
		if !errors.Is(pe.Errs[2], outbox.ErrSkipped) || pe.Errs[1] != nil || pe.Errs[3] != nil {
			t.Errorf("topic %.20q: errors %v; want event 2 skipped behind its key's poison, 1 and 3 published", bad, pe.Errs)
		}
		// The bound is loose on purpose: the publish connects and produces
		// events 1 and 3 too, which took over a second on a loaded 2-core
		// machine. Before the fix, Publish retried the illegal topic and never
		// returned.
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("topic %.20q: Publish took %s; an illegal topic needs no broker to be refused", bad, d)
		}
	}
}

// kgo fails a producer ID for good when the broker refuses InitProducerID
// with an error it does not retry (CLUSTER_AUTHORIZATION_FAILED while an
// ACL is missing): every later record of the client failed at once, and
// the relay never published again, even once the ACL was granted. The
// publisher replaces a client of its own; a client of the caller's is
// logged, as it cannot be replaced.
func TestPublishProducerIDFailedForGood(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 2)

	logs := &testlog.Buffer{}
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	first := p.Client()
	fault := fake.Fault(kfakeFault(kmsg.InitProducerID, "", kerr.ClusterAuthorizationFailed, 1))
	evs := newEvents(t, 4, 2)
	if err := p.Publish(t.Context(), evs); !errors.Is(err, kerr.ClusterAuthorizationFailed) || errors.Is(err, outbox.ErrPoison) {
		t.Fatalf("Publish with InitProducerID refused = %v; want CLUSTER_AUTHORIZATION_FAILED, not poison", err)
	}
	if fault.Hits() != 1 {
		t.Fatalf("%d faults; want 1", fault.Hits())
	}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatalf("Publish once the broker grants a producer ID = %v", err)
	}
	if p.Client() == first {
		t.Error("the client whose producer ID failed is still in use")
	}
	mustPublished(t, kc.Records(t, topic), evs)
	if !strings.Contains(logs.String(), "publishing with a new client") {
		t.Errorf("the renewal was not logged: %s", logs.String())
	}

	// A sequence lost with StopProducerOnDataLossDetected: kgo fails the
	// producer ID for good too; the events are still in the outbox, so
	// the publisher goes on with a new client.
	stop := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(), ExtraOpts: []kgo.Opt{kgo.StopProducerOnDataLossDetected()}})
	fake.Fault(kfakeFault(kmsg.Produce, topic, kerr.OutOfOrderSequenceNumber, 1))
	lost := newEvents(t, 2, 1)
	if err := stop.Publish(t.Context(), lost); !errors.Is(err, kerr.OutOfOrderSequenceNumber) {
		t.Fatalf("Publish with a lost sequence and StopProducerOnDataLossDetected = %v; want OUT_OF_ORDER_SEQUENCE_NUMBER", err)
	}
	if err := stop.Publish(t.Context(), lost); err != nil {
		t.Fatalf("Publish after the lost sequence = %v", err)
	}
	mustPublished(t, kc.Records(t, topic), append(evs, lost...))

	// A client of the caller's.
	logs = &testlog.Buffer{}
	cl := kc.Client(t)
	theirs := newPublisher(t, idemkafka.PublisherConfig{Client: cl, DefaultTopic: topic, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	fake.Fault(kfakeFault(kmsg.InitProducerID, "", kerr.ClusterAuthorizationFailed, 1))
	for range 2 {
		if err := theirs.Publish(t.Context(), newEvents(t, 2, 2)); !errors.Is(err, kerr.ClusterAuthorizationFailed) {
			t.Fatalf("Publish through the caller's failed client = %v; want CLUSTER_AUTHORIZATION_FAILED", err)
		}
	}
	if theirs.Client() != cl || !strings.Contains(logs.String(), "give the publisher a new client") {
		t.Errorf("the caller's failed client: replaced %v, logs %s", theirs.Client() != cl, logs.String())
	}
}
