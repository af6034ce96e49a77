package idemkafka_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
)

// A second member joins the group while the first is in the middle of a
// batch. The rebalance waits for that batch (applied and committed), then
// moves partitions; over 2,000 events (plus 196 duplicate records) nothing
// is lost, nothing takes effect twice, and each key keeps its order.
func TestRebalanceInFlight(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testRebalanceInFlight[pgx.Tx], testRebalanceInFlight[*sql.Tx])
}

func testRebalanceInFlight[TTx any](t *testing.T, b *backend[TTx]) {
	const (
		n      = 2000
		parts  = 6
		keys   = 40
		joinAt = 600 // the handler call of the first member during which the second joins
	)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", parts)
	group := kafkatest.Name("g")
	evs := newEvents(t, n, keys)
	var rs []*kgo.Record
	for i, e := range evs {
		rs = append(rs, recordsOf(topic, e)...)
		if i%10 == 9 && i >= keys { // a duplicate of an earlier event of the same key
			rs = append(rs, recordsOf(topic, evs[i-keys])...)
		}
	}
	kc.Produce(t, topic, rs...)

	var (
		calls    atomic.Int64
		joining  = make(chan struct{})
		blocked  = make(chan struct{})
		once     sync.Once
		revokedA atomic.Int64
	)
	// The first member, in the middle of a batch, lets the second one
	// start and waits until the rebalance waits for it.
	hookA := func(event.Envelope) error {
		if calls.Add(1) == joinAt {
			close(joining)
			select {
			case <-blocked:
			case <-time.After(60 * time.Second):
				t.Error("the rebalance never waited for the batch in flight")
			}
		}
		return nil
	}
	cfgA := consumerConfig(kc, b, "billing", group, hookA, topic)
	cfgA.MaxPollRecords = 100
	cfgA.ExtraOpts = append(cfgA.ExtraOpts,
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { once.Do(func() { close(blocked) }) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			revokedA.Add(int64(len(ps[topic])))
		}),
	)
	a := start(t, b, "billing", cfgA)

	select {
	case <-joining:
	case <-time.After(90 * time.Second): // 566 events took 30 s on a busy machine
		t.Fatalf("the first member applied only %d events in 90 s", calls.Load())
	}
	cfgB := consumerConfig(kc, b, "billing", group, nil, topic)
	cfgB.MaxPollRecords = 100
	bb := start(t, b, "billing", cfgB)
	joined := time.Now()

	// The rest of the events (1,400) take as long as the first 600 and
	// more on a busy machine (a database/sql run missed a wait of 60 s):
	// the wait lasts as long as the effects and the committed offsets
	// grow, and fails after 60 s without progress.
	waitProgress(t, 60*time.Second, "every event applied and every partition committed", func() (bool, int64) {
		d := distinct(t, b, "billing")
		progress := int64(d)
		for _, off := range kc.Committed(t, group, topic) {
			progress += off
		}
		return d == n && allCommitted(t, kc, group, topic), progress
	})
	t.Logf("every event applied and committed %s after the second member started", time.Since(joined).Round(time.Millisecond))
	handedOver := revokedA.Load() // before the stop revokes the rest
	mustStop(t, a)
	mustStop(t, bb)

	mustOnce(t, b, "billing", evs)
	mustKeyOrder(t, b.rows(t, "billing"))
	sa, sb := a.stats.get(), bb.stats.get()
	if handedOver == 0 || sb.applied == 0 {
		t.Errorf("the first member handed over %d partitions, the second applied %d events; want a real handover", handedOver, sb.applied)
	}
	if sa.applied+sb.applied != n || sa.dead+sb.dead != 0 {
		t.Errorf("applied %d+%d, dead-lettered %d+%d; want %d applied, none dead-lettered", sa.applied, sb.applied, sa.dead, sb.dead, n)
	}
	t.Logf("first member: %d applied, %d duplicates, %d partitions handed over; second: %d applied, %d duplicates",
		sa.applied, sa.duplicates, handedOver, sb.applied, sb.duplicates)
}
