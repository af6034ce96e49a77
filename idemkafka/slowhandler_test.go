package idemkafka_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A member's poll takes longer than the group's rebalance timeout (a slow
// handler: kgo has no max.poll.interval, but a rebalance waits for the
// poll in flight at most that long) while a second member joins: the
// broker evicts the slow member, the other takes its partitions and
// consumes them from the group's last commit, while the slow one still
// applies its poll. Nothing is skipped, nothing takes effect twice, each
// key keeps its order, and every partition is committed to its end.
func TestHandlerSlowerThanRebalanceTimeout(t *testing.T) {
	t.Parallel()
	b := setupPostgres(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 4)
	group := kafkatest.Name("g")
	const n, keys = 400, 20
	evs := newEvents(t, n, keys)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	slow := func(event.Envelope) error { time.Sleep(40 * time.Millisecond); return nil }
	cfgA := consumerConfig(kc, b, "billing", group, slow, topic)
	cfgA.MaxPollRecords = 100 // 4 s a poll
	cfgA.ExtraOpts = append(cfgA.ExtraOpts, kgo.RebalanceTimeout(time.Second))
	a := start(t, b, "billing", cfgA)
	waitFor(t, 30*time.Second, "the first member applies", func() bool { return distinct(t, b, "billing") > 10 })

	cfgB := consumerConfig(kc, b, "billing", group, nil, topic)
	cfgB.ExtraOpts = append(cfgB.ExtraOpts, kgo.RebalanceTimeout(time.Second))
	bb := start(t, b, "billing", cfgB)

	var applied int
	var committed, ends map[int32]int64
	deadline := time.Now().Add(90 * time.Second)
	for {
		applied = distinct(t, b, "billing")
		committed, ends = kc.Committed(t, group, topic), kc.EndOffsets(t, topic)
		if applied == n && allCommitted(t, kc, group, topic) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s: %d of %d events applied; committed %v of ends %v; slow member %+v, other %+v",
				applied, n, committed, ends, a.stats.get(), bb.stats.get())
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustStop(t, a)
	mustStop(t, bb)
	mustOnce(t, b, "billing", evs)
	mustKeyOrder(t, b.rows(t, "billing"))
	sa, sb := a.stats.get(), bb.stats.get()
	t.Logf("slow member: %d applied, %d duplicates, %d commit failures; other: %d applied, %d duplicates",
		sa.applied, sa.duplicates, sa.commitFailures, sb.applied, sb.duplicates)
}
