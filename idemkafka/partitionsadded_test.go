package idemkafka_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// An operator adds partitions to a topic while a relay publishes to it and
// its consumers run (kadm CreatePartitions, kafka-topics --alter
// --partitions). The relay's publisher must learn of them soon, and the
// consumers must consume them soon, from their start: with kgo's metadata
// max age, 5 minutes, the relay went on with the old partitions for up to
// 5 minutes (while a relay started since, or another replica's, used the
// new ones), and the group's leader handed the new partitions out up to 5
// minutes later: their records waited unconsumed meanwhile.
func TestPartitionsAddedPublishedAndConsumedPromptly(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	r := newRelayRig(t, kc, topic, outbox.RelayConfig{})
	r.run(t)

	const keys = 40
	all := newEvents(t, keys, keys)
	r.enqueue(t, all...)
	waitFor(t, 30*time.Second, "the first events applied", func() bool { return distinct(t, b, "billing") == len(all) })

	if _, err := kc.Admin().CreatePartitions(context.Background(), 2, topic); err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	limit := idemkafka.DefaultMetadataMaxAge + 5*time.Second
	// The keys' later events, until the relay writes some to the new
	// partitions.
	for n := 1; ; n++ {
		ends := kc.EndOffsets(t, topic)
		if ends[2]+ends[3] > 0 {
			t.Logf("the relay wrote to the new partitions %.1f s after they were added", time.Since(added).Seconds())
			break
		}
		if time.Since(added) > limit {
			t.Fatalf("the relay still writes to the old partitions only %v after partitions were added (ends %v)", time.Since(added).Round(time.Second), ends)
		}
		evs := make([]event.Envelope, keys)
		for i := range evs {
			evs[i] = mustEvent(t, all[i].Key, n*keys+i)
		}
		r.enqueue(t, evs...)
		all = append(all, evs...)
		time.Sleep(500 * time.Millisecond)
	}
	waitFor(t, 30*time.Second, "the relay published every event", func() bool { p, _, _ := r.count(t); return p == len(all) })
	for distinct(t, b, "billing") < len(all) {
		if time.Since(added) > limit {
			t.Fatalf("%d of %d events applied %v after partitions were added (ends %v, committed %v)",
				distinct(t, b, "billing"), len(all), time.Since(added).Round(time.Second), kc.EndOffsets(t, topic), kc.Committed(t, group, topic))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every event applied %.1f s after the partitions were added", time.Since(added).Seconds())
	r.stop()
	mustStop(t, inst)
	mustOnce(t, b, "billing", all)
}

// mustEvent is an event of key whose payload is {"n": n}.
func mustEvent(t testing.TB, key string, n int) event.Envelope {
	t.Helper()
	e, err := event.New("OrderCreated.v1", key, payload{N: n})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The clients read the metadata every DefaultMetadataMaxAge unless
// ExtraOpts say otherwise; a MetadataMinAge above it raises it (kgo
// refuses a max age below the min age: the client would not start).
func TestMetadataMaxAgeOptions(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		want time.Duration
	}{
		{"default", nil, idemkafka.DefaultMetadataMaxAge},
		{"min age above", []kgo.Opt{kgo.MetadataMinAge(30 * time.Second)}, 30 * time.Second},
		{"set", []kgo.Opt{kgo.MetadataMaxAge(2 * time.Minute)}, 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, ExtraOpts: tc.opts})
			if got, _ := p.Client().OptValue(kgo.MetadataMaxAge).(time.Duration); got != tc.want {
				t.Errorf("publisher's MetadataMaxAge %v; want %v", got, tc.want)
			}
			b := setupSQLite(t)
			cfg := consumerConfig(kc, b, "billing", kafkatest.Name("g"), nil, topic)
			cfg.ExtraOpts = append(cfg.ExtraOpts, tc.opts...)
			inst := start(t, b, "billing", cfg)
			evs := newEvents(t, 3, 3)
			kc.Produce(t, topic, recordsOf(topic, evs...)...)
			waitFor(t, 30*time.Second, "the consumer applies", func() bool { return distinct(t, b, "billing") >= len(evs) })
			mustStop(t, inst)
		})
	}
}

// A consumer whose ExtraOpts set kgo.ConsumeResetOffset at the log's end
// (Java's auto.offset.reset=latest, a habit) skips the records written to
// a partition before its group took it (a partition added to the topic, a
// group deleted): Run says so at start, which it did not.
func TestConsumeResetOffsetAtEndWarned(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		warn bool
	}{
		{"default", nil, false},
		{"start", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, false},
		{"end", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd())}, true},
		{"end relative", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd().Relative(-10))}, true},
		{"after a time", []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(time.Now().UnixMilli()))}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setupSQLite(t)
			logs := &testlog.Buffer{}
			cfg := consumerConfig(kc, b, "billing", kafkatest.Name("g"), nil, topic)
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
			cfg.ExtraOpts = append(cfg.ExtraOpts, tc.opts...)
			inst := start(t, b, "billing", cfg)
			waitFor(t, 10*time.Second, "the consumer started", func() bool { return strings.Contains(logs.String(), "consumer started") })
			mustStop(t, inst)
			if warned := strings.Contains(logs.String(), "ConsumeResetOffset is at the log's end"); warned != tc.warn {
				t.Errorf("warned %v; want %v; logs:\n%s", warned, tc.warn, logs.String())
			}
		})
	}
}
