package idemkafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/internal/kafkatest"
)

// Operators act on a consumer group while its consumers run: the group
// coordinator moves between brokers (a broker restarted, a rebalance of
// the __consumer_offsets leaders), and an operator tries to delete the
// group (kadm DeleteGroups, kafka-consumer-groups --delete), which the
// brokers refuse while it has members; deleted once its consumers
// stopped, the group starts over from the log start and the inbox drops
// every record applied before. Nothing is skipped or applied twice.
func TestGroupCoordinatorMovesAndGroupDeleted(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t, kfake.NumBrokers(3))
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 6)
	group := kafkatest.Name("g")
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))

	var all = newEvents(t, 600, 30)
	for i := 0; i < len(all); i += 60 {
		kc.Produce(t, topic, recordsOf(topic, all[i:i+60]...)...)
		fake.RehashCoordinators()
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, 60*time.Second, "every event applied and committed while the coordinator moved", func() bool {
		return distinct(t, b, "billing") == len(all) && allCommitted(t, kc, group, topic)
	})
	resp, err := kc.Admin().DeleteGroups(context.Background(), group)
	if err == nil {
		err = resp.Error()
	}
	if !errors.Is(err, kerr.NonEmptyGroup) {
		t.Errorf("DeleteGroups of a group with members: %v; want NON_EMPTY_GROUP", err)
	}
	mustStop(t, inst)

	resp, err = kc.Admin().DeleteGroups(context.Background(), group)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("DeleteGroups of the stopped group: %v", err)
	}
	later := newEvents(t, 60, 30)
	kc.Produce(t, topic, recordsOf(topic, later...)...)
	inst = start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 60*time.Second, "the group started over", func() bool {
		return distinct(t, b, "billing") == len(all)+len(later) && allCommitted(t, kc, group, topic)
	})
	mustStop(t, inst)
	mustOnce(t, b, "billing", append(all, later...))
	s := inst.stats.get()
	if s.duplicates != len(all) {
		t.Errorf("after the group was deleted: %d duplicates; want the %d events applied before", s.duplicates, len(all))
	}
}
