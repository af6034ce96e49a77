package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// A publish to a topic the broker does not have (and does not create for
// this client) fails with an error that names the topic and says what to
// do, in the line the relay logs (outbox.PublishError's message), not only
// kerr's "This server does not host this topic-partition".
func TestPublishMissingTopicSaysWhatToDo(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kafkatest.Name("missing")
	p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: []kgo.Opt{fastRetry}})
	err := p.Publish(t.Context(), newEvents(t, 2, 2))
	if !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("Publish: %v; want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	for _, want := range []string{
		`topic "` + topic + `" does not exist: create it (and its dead-letter topic, ` + topic + `.dlq by default)`,
		"kgo.AllowAutoTopicCreation",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Publish: %q; want it to say %q", err, want)
		}
	}
}

// A consumer subscribed to a topic the broker does not have WARNs once,
// naming it, and goes on consuming its other topics; it does not warn
// about those, nor again at later polls.
func TestConsumerWarnsOfMissingTopicOnce(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	b := setupSQLite(t)
	present := kc.Topic(t, "present", 1)
	missing := kafkatest.Name("missing")
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "c", kafkatest.Name("g"), nil, present, missing)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	in := start(t, b, "c", cfg)

	const warning = "idemkafka: the brokers do not have topics this consumer subscribes to"
	waitFor(t, 10*time.Second, "the warning", func() bool { return strings.Contains(logs.String(), warning) })
	// Polls go on: the present topic's records are applied.
	for round := range 3 {
		evs := newEvents(t, 2, 2)
		kc.Produce(t, present, recordsOf(present, evs...)...)
		waitFor(t, 10*time.Second, "the records applied", func() bool { return in.stats.get().applied == 2*(round+1) })
	}
	mustStop(t, in)

	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, warning) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d warnings; want one:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	if l := lines[0]; !strings.Contains(l, "level=WARN") || !strings.Contains(l, "topics=["+missing+"]") ||
		!strings.Contains(l, "create them, or enable auto-creation") {
		t.Errorf("warning %q; want a WARN naming only %s and the fix", l, missing)
	}
	// The dead-letter topics (neither exists here) get a warning of their
	// own, once.
	const dlqWarning = "idemkafka: the brokers do not have this consumer's dead-letter topics"
	if n := strings.Count(logs.String(), dlqWarning); n != 1 ||
		!strings.Contains(logs.String(), "topics=\"["+present+".dlq "+missing+".dlq]\"") &&
			!strings.Contains(logs.String(), "topics=["+present+".dlq "+missing+".dlq]") {
		t.Errorf("%d dead-letter warnings; want one naming %s.dlq and %s.dlq:\n%s", n, present, missing, logs.String())
	}
}

// A consumer whose topics and dead-letter topics all exist warns of none.
func TestConsumerNoMissingTopicWarning(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	b := setupSQLite(t)
	topic := kc.Topic(t, "present", 1)
	kc.CreateTopic(t, topic+idemkafka.DeadLetterSuffix, 1)
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "c", kafkatest.Name("g"), nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	in := start(t, b, "c", cfg)
	evs := newEvents(t, 2, 2)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	waitFor(t, 10*time.Second, "the records applied", func() bool { return in.stats.get().applied == 2 })
	mustStop(t, in) // Run waits for the look at the topics
	if strings.Contains(logs.String(), "do not have") {
		t.Errorf("warned of a missing topic:\n%s", logs.String())
	}
}

// A record to dead-letter while the dead-letter topic is missing holds its
// partition; the error the consumer reports (BatchStats.Err, and its WARN
// lines) names the topic and says what to do.
func TestDeadLetterMissingTopicSaysWhatToDo(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	b := setupSQLite(t)
	topic := kc.Topic(t, "nodlq", 1)
	errs := make(chan error, 16)
	cfg := consumerConfig(kc, b, "c", kafkatest.Name("g"), nil, topic)
	cfg.ExtraOpts = append(cfg.ExtraOpts, fastRetry, kgo.UnknownTopicRetries(1))
	cfg.OnBatch = func(_ context.Context, s idemkafka.BatchStats) {
		if s.Err != nil {
			select {
			case errs <- s.Err:
			default:
			}
		}
	}
	start(t, b, "c", cfg)
	kc.Produce(t, topic, &kgo.Record{Topic: topic, Value: []byte("not an idem event")})
	select {
	case err := <-errs:
		want := `topic "` + topic + `.dlq" does not exist: create it, or enable auto-creation`
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || !strings.Contains(err.Error(), want) {
			t.Errorf("BatchStats.Err = %v; want UNKNOWN_TOPIC_OR_PARTITION saying %q", err, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no failed batch reported within 30s")
	}
}

// A handler whose outbox.EnqueueTx finds idem's tables missing
// (driver.ErrNotMigrated: the database was not migrated) fails for a reason
// no record can fix: retried as a database failure, never dead-lettered,
// and applied once an operator migrated. Every record went to the
// dead-letter topic before.
func TestNotMigratedHandlerErrorNotDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	kc.Produce(t, topic, recordsOf(topic, newEvents(t, 2, 2)...)...)
	var tries atomic.Int32
	hook := func(event.Envelope) error {
		if tries.Add(1) <= 8 { // more than Retry.Attempts (3)
			return fmt.Errorf("outbox: enqueue: sqlitedriver: outbox insert: %w", driver.ErrNotMigrated)
		}
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 30*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	if s := inst.stats.get(); s.dead != 0 || s.applied != 2 {
		t.Fatalf("after 8 ErrNotMigrated: %d dead-lettered, %d applied; want 0 and 2", s.dead, s.applied)
	}
}
