package idemkafka_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/kafkatest"
)

// The same event delivered twice in one batch, and ten times over several
// polls (five copies, then five more after the first ones were committed):
// one effect, the copies counted as duplicates.
func TestDeliveredRepeatedly(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testDeliveredRepeatedly[pgx.Tx], testDeliveredRepeatedly[*sql.Tx])
}

func testDeliveredRepeatedly[TTx any](t *testing.T, b *backend[TTx]) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 3)
	group := kafkatest.Name("g")
	evs := newEvents(t, 3, 3)
	twice, tenTimes, once := evs[0], evs[1], evs[2]

	// Twice, adjacent, in one poll; and the first half of the ten.
	kc.Produce(t, topic, recordsOf(topic, twice, twice, once, tenTimes, tenTimes, tenTimes, tenTimes, tenTimes)...)
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 20*time.Second, "the first records committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustOnce(t, b, "billing", evs)

	// The other five copies, each in a produce of its own.
	for range 5 {
		kc.Produce(t, topic, recordsOf(topic, tenTimes)...)
	}
	waitFor(t, 20*time.Second, "the later copies committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.applied != 3 || s.duplicates != 10 || s.dead != 0 {
		t.Errorf("stats: applied %d, duplicates %d, dead-lettered %d; want 3, 10, 0", s.applied, s.duplicates, s.dead)
	}
}

// Two instances of one consumer group, each owning half of the partitions,
// get every event at the same time (each event is written to every
// partition): one effect per event; the database decides which copy wins.
func TestTwoInstancesConcurrently(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testTwoInstances[pgx.Tx], testTwoInstances[*sql.Tx])
}

func testTwoInstances[TTx any](t *testing.T, b *backend[TTx]) {
	const (
		parts  = 4
		events = 60
	)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", parts)
	group := kafkatest.Name("g")

	var (
		mu    sync.Mutex
		owned = map[string]map[int32]bool{}
	)
	track := func(name string) []kgo.Opt {
		mu.Lock()
		owned[name] = map[int32]bool{}
		mu.Unlock()
		set := func(v bool) func(context.Context, *kgo.Client, map[string][]int32) {
			return func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
				mu.Lock()
				defer mu.Unlock()
				for _, p := range ps[topic] {
					owned[name][p] = v
				}
			}
		}
		return []kgo.Opt{kgo.OnPartitionsAssigned(set(true)), kgo.OnPartitionsRevoked(set(false)), kgo.OnPartitionsLost(set(false))}
	}
	owns := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range owned[name] {
			if v {
				n++
			}
		}
		return n
	}

	// A slow handler, so that the two instances' batches overlap.
	slow := func(event.Envelope) error {
		time.Sleep(time.Millisecond)
		return nil
	}
	var insts []*instance
	for _, name := range []string{"a", "b"} {
		cfg := consumerConfig(kc, b, "billing", group, slow, topic)
		cfg.ExtraOpts = append(cfg.ExtraOpts, track(name)...)
		insts = append(insts, start(t, b, "billing", cfg))
	}
	waitFor(t, 30*time.Second, "both instances to own partitions", func() bool {
		return owns("a") > 0 && owns("b") > 0 && owns("a")+owns("b") == parts
	})

	evs := newEvents(t, events, 10)
	var rs []*kgo.Record
	for _, e := range evs {
		for p := range int32(parts) {
			r := recordsOf(topic, e)[0]
			r.Partition = p
			rs = append(rs, r)
		}
	}
	cl := kc.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(t.Context(), rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	waitFor(t, 30*time.Second, "every copy committed", func() bool { return allCommitted(t, kc, group, topic) })
	for _, in := range insts {
		mustStop(t, in)
	}

	mustOnce(t, b, "billing", evs)
	a, bb := insts[0].stats.get(), insts[1].stats.get()
	if a.batches == 0 || bb.batches == 0 {
		t.Errorf("instance batches: %d and %d; want both to have processed copies", a.batches, bb.batches)
	}
	if a.applied+bb.applied != events || a.duplicates+bb.duplicates != events*(parts-1) {
		t.Errorf("instances applied %d+%d, skipped %d+%d duplicates; want %d applied and %d duplicates in all",
			a.applied, bb.applied, a.duplicates, bb.duplicates, events, events*(parts-1))
	}
	t.Logf("instance a applied %d, skipped %d; b applied %d, skipped %d", a.applied, a.duplicates, bb.applied, bb.duplicates)
}

// Cancelling Run while a batch is in flight: the batch finishes and
// commits, its offsets are committed (exactly up to what was applied), and
// a restarted consumer applies the rest without repeating anything.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 30, 5)
	kc.Produce(t, topic, recordsOf(topic, evs[:20]...)...)

	inFlight := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	hook := func(e event.Envelope) error {
		if e.ID == evs[3].ID {
			once.Do(func() {
				close(inFlight)
				<-release
			})
		}
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("the batch never started")
	}
	inst.cancel() // stop while the handler is inside the batch
	close(release)
	mustStop(t, inst)

	applied := len(b.rows(t, "billing"))
	if applied < 4 {
		t.Fatalf("%d effects after the shutdown; want the whole batch in flight (at least 4)", applied)
	}
	if got := kc.Committed(t, group, topic)[0]; got != int64(applied) {
		t.Fatalf("committed offset %d after the shutdown; want %d (the records applied)", got, applied)
	}

	kc.Produce(t, topic, recordsOf(topic, evs[20:]...)...)
	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 20*time.Second, "the rest committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
	if s := again.stats.get(); s.duplicates != 0 || s.applied != len(evs)-applied {
		t.Errorf("restarted consumer applied %d, skipped %d; want %d and 0 (nothing redelivered)", s.applied, s.duplicates, len(evs)-applied)
	}
}

// Per-key order: the effects of each key appear in the order of the
// events' n (events of a key are produced in increasing n).
func mustKeyOrder(t *testing.T, rows []effectRow) {
	t.Helper()
	last := map[string]int{}
	for _, r := range rows {
		if n, ok := last[r.Key]; ok && r.N < n {
			t.Fatalf("key %s: event %d applied after event %d", r.Key, r.N, n)
		}
		last[r.Key] = r.N
	}
}

// Without ConsumerConfig.Group, the consumer joins the group named after its
// inbox's consumer: one name in Kafka and in processed_event.
func TestGroupDefaultsToInboxConsumer(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	consumer := kafkatest.Name("billing")
	evs := newEvents(t, 4, 2)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	cfg := consumerConfig(kc, b, consumer, "", nil, topic)
	inst := start(t, b, consumer, cfg)
	waitFor(t, 20*time.Second, "the records committed by group "+consumer, func() bool { return allCommitted(t, kc, consumer, topic) })
	mustStop(t, inst)
	mustOnce(t, b, consumer, evs)
}
