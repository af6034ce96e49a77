package idemkafka_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

// An operator deletes the topic while its consumers run and creates it
// again (to change its partitions or a setting kafka-configs cannot), then
// the producers write more records to the new topic than the group had
// consumed of the old one: the consumers must apply every record of the
// new topic, from its start, not resume at the old topic's offsets (which
// would skip the new topic's first records).
func TestConsumerTopicRecreated(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kafkatest.Name("orders")
	if err := fake.CreateTopic(topic, 2, nil); err != nil {
		t.Fatal(err)
	}
	group := kafkatest.Name("g")
	logs := &testlog.Buffer{}
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.Retry.Backoff = idemkafka.DefaultBackoff
	inst := start(t, b, "billing", cfg)
	first := newEvents(t, 60, 10)
	kc.Produce(t, topic, recordsOf(topic, first...)...)
	waitFor(t, 30*time.Second, "the first events applied and committed", func() bool {
		return distinct(t, b, "billing") == len(first) && allCommitted(t, kc, group, topic)
	})
	if err := fake.DeleteTopic(topic); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // fetches fail meanwhile
	if err := fake.CreateTopic(topic, 2, nil); err != nil {
		t.Fatal(err)
	}
	later := newEvents(t, 200, 10)
	kc.Produce(t, topic, recordsOf(topic, later...)...)
	written := time.Now()
	deadline := written.Add(30 * time.Second)
	for distinct(t, b, "billing") < len(first)+len(later) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the new topic's %d events applied (ends %v, committed %v)",
				distinct(t, b, "billing")-len(first), len(later), kc.EndOffsets(t, topic), kc.Committed(t, group, topic))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the new topic's events applied %.1f s after they were written", time.Since(written).Seconds())
	mustStop(t, inst)
	mustOnce(t, b, "billing", append(first, later...))
	_, fetchErrs := logLines(logs.String(), "ERROR", "fetch failed")
	_, anew := logLines(logs.String(), "WARN", "consuming them anew")
	t.Logf("%d failed fetches logged, %d WARN consuming anew", fetchErrs, anew)
	if anew == 0 {
		t.Errorf("the topic's new instance was consumed without a WARN; logs:\n%s", logs.String())
	}
}
