package idemkafka_test

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
)

// The partitions a consumer takes over on a rebalance (another member died
// or left) are consumed at once, even while the partitions it already had
// are idle. kgo adds them to the broker's fetch in flight only when that
// fetch returns, and a fetch of idle partitions waits for records up to
// its max wait: with kgo's default, 5 s, a dead member's partitions were
// taken over up to 5 s late.
//
// The other member is a plain client that never fetches (its partitions'
// events wait for it), so the consumer owns the rest; once its own
// partitions are committed to their end, the other member leaves, and
// every event must be applied well before a 5 s fetch would return. The
// seconds the test process got no CPU at all (a loaded CI machine stalls
// it for 4 s at times) are added to that bound: they measure the machine.
func TestConsumerTakesOverLeftPartitionsAtOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 3)
	group := kafkatest.Name("g")

	member := kc.IdleMember(t, group, topic, kgo.HeartbeatInterval(200*time.Millisecond))
	owned := member.Owned
	waitFor(t, 30*time.Second, "the other member owns every partition", func() bool { return len(owned()) == 3 })

	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	// Cooperative rebalancing hands the consumer some of the partitions.
	waitFor(t, 30*time.Second, "the consumer takes some partitions", func() bool { n := len(owned()); return n > 0 && n < 3 })
	theirs := owned()

	evs := newEvents(t, 30, 30) // 30 keys: every partition gets some
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	ends := kc.EndOffsets(t, topic)
	for p, end := range ends {
		if end == 0 {
			t.Fatalf("partition %d got none of the 30 events (ends %v)", p, ends)
		}
	}
	waitFor(t, 30*time.Second, "the consumer commits its partitions to their end", func() bool {
		committed := kc.Committed(t, group, topic)
		for p, end := range ends {
			if !slices.Contains(theirs, p) && committed[p] != end {
				return false
			}
		}
		return true
	})
	// Its next fetch is idle now; let it go out.
	time.Sleep(200 * time.Millisecond)

	watch := stallmeter.Start(t)
	left := time.Now()
	member.Close() // leaves the group: its partitions move to the consumer
	waitFor(t, 15*time.Second, "every event applied after the other member left", func() bool {
		return distinct(t, b, "billing") == len(evs)
	})
	took, stalled := time.Since(left), watch.Stop()
	t.Logf("the events of the partitions %v were applied %.2f s after the other member left (the process stalled %v meanwhile)", theirs, took.Seconds(), stalled)
	if limit := 3*time.Second + stalled; took > limit {
		t.Errorf("the events of the partitions %v, moved to the consumer, were applied %.2f s after the other member left; want under %v (a heartbeat, a fetch's max wait and the batch, and %v the process stalled)",
			theirs, took.Seconds(), limit, stalled)
	}
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
}
