package idemkafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
)

// bulkCalls records the calls of a batch handler.
type bulkCalls struct {
	mu    sync.Mutex
	sizes []int
	seen  map[uuid.UUID]int // calls that included the event
}

func (c *bulkCalls) add(evs []event.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[uuid.UUID]int{}
	}
	c.sizes = append(c.sizes, len(evs))
	for _, e := range evs {
		c.seen[e.ID]++
	}
}

func (c *bulkCalls) get() (sizes []int, seen map[uuid.UUID]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen = make(map[uuid.UUID]int, len(c.seen))
	for id, n := range c.seen {
		seen[id] = n
	}
	return append([]int(nil), c.sizes...), seen
}

// batchConfig is consumerConfig with a BatchHandler instead of the Handler:
// it writes the effects of all its events, then returns hook's error (if
// any), so a failure rolls back effects that were written.
func batchConfig[TTx any](kc *kafkatest.Cluster, b *backend[TTx], consumer, group string, calls *bulkCalls, hook func(evs []event.Envelope) error, topics ...string) idemkafka.ConsumerConfig[TTx] {
	cfg := consumerConfig(kc, b, consumer, group, nil, topics...)
	cfg.Handler = nil
	cfg.BatchHandler = func(ctx context.Context, tx TTx, evs []event.Envelope) error {
		calls.add(evs)
		for _, e := range evs {
			if err := b.effect(ctx, tx, consumer, e); err != nil {
				return err
			}
		}
		if hook != nil {
			return hook(evs)
		}
		return nil
	}
	return cfg
}

// A batch handler gets each poll's new events in one call: every event
// takes effect once, the copies delivered in the same poll and in later
// ones are never passed to it.
func TestBatchHandlerAppliesOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testBatchHandlerOnce[pgx.Tx], testBatchHandlerOnce[*sql.Tx])
}

func testBatchHandlerOnce[TTx any](t *testing.T, b *backend[TTx]) {
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	evs := newEvents(t, 60, 6)
	// Each of the first ten events twice in the first produce.
	kc.Produce(t, topic, recordsOf(topic, append(evs[:10:10], evs...)...)...)

	var calls bulkCalls
	inst := start(t, b, "billing", batchConfig(kc, b, "billing", group, &calls, nil, topic))
	waitFor(t, 20*time.Second, "the first records committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustOnce(t, b, "billing", evs)
	// Ten more copies, after the originals were committed.
	kc.Produce(t, topic, recordsOf(topic, evs[20:30]...)...)
	waitFor(t, 20*time.Second, "the later copies committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.applied != 60 || s.duplicates != 20 || s.dead != 0 || s.failures != 0 {
		t.Errorf("stats: applied %d, duplicates %d, dead-lettered %d, failures %d; want 60, 20, 0, 0", s.applied, s.duplicates, s.dead, s.failures)
	}
	sizes, seen := calls.get()
	for _, e := range evs {
		if seen[e.ID] != 1 {
			t.Errorf("event %d passed to the batch handler %d times; want 1", mustN(t, e), seen[e.ID])
		}
	}
	biggest := 0
	for _, n := range sizes {
		if n == 0 {
			t.Error("batch handler called with no event")
		}
		biggest = max(biggest, n)
	}
	if biggest < 2 {
		t.Errorf("batch handler calls of sizes %v; want batches of several events", sizes)
	}
}

// A poison record (ErrPoison) and a record that keeps failing, in the
// middle of a batch: the batch rolls back, its records are applied one at a
// time, the two are dead-lettered (the failing one after Retry.Attempts
// tries alone), every other event takes effect once, and no offset is
// committed ahead of its record's effect or dead letter.
func TestBatchHandlerPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")

	evs := newEvents(t, 12, 3)
	poison, failing := evs[3], evs[7]
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	good := make([]event.Envelope, 0, len(evs))
	for _, e := range evs {
		if e.ID != poison.ID && e.ID != failing.ID {
			good = append(good, e)
		}
	}

	hook := func(evs []event.Envelope) error {
		for _, e := range evs {
			switch e.ID {
			case poison.ID:
				return fmt.Errorf("unknown product in event %d: %w", mustN(t, e), idemkafka.ErrPoison)
			case failing.ID:
				return errBoom
			}
		}
		return nil
	}
	// Every committed offset comes after the effects or dead letters of
	// the records before it.
	var early atomic.Value
	check := func(c *idemkafka.Consumer[*sqlTx]) {
		idemkafka.SetBeforeCommit(c, func(rs []*kgo.Record) {
			done := counts(b.rows(t, "billing"))
			copies := kc.EndOffsets(t, dlq)[0]
			for off := int64(0); off <= rs[0].Offset; off++ {
				e := evs[off]
				dead := e.ID == poison.ID || e.ID == failing.ID
				if (!dead && done[e.ID] != 1) || (dead && copies == 0) {
					early.Store(fmt.Sprintf("committing offset %d before record %d was applied or dead-lettered", rs[0].Offset, off))
				}
			}
		})
	}
	var calls bulkCalls
	inst := start(t, b, "billing", batchConfig(kc, b, "billing", group, &calls, hook, topic), check)
	waitFor(t, 20*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	if msg := early.Load(); msg != nil {
		t.Fatal(msg)
	}
	mustOnce(t, b, "billing", good)
	if s := inst.stats.get(); s.dead != 2 || s.applied != len(good) {
		t.Errorf("stats: dead-lettered %d, applied %d; want 2 and %d", s.dead, s.applied, len(good))
	}
	sizes, seen := calls.get()
	singles := 0
	for _, n := range sizes {
		if n == 1 {
			singles++
		}
	}
	if singles == 0 || len(sizes) == singles {
		t.Errorf("batch handler calls of sizes %v; want batches and single records", sizes)
	}
	// The failing record: its batch's call, then Attempts (3) tries alone.
	if n := seen[failing.ID]; n < 3 {
		t.Errorf("failing record passed to the handler %d times; want at least 3 (alone)", n)
	}

	copies := kc.Records(t, dlq)
	if len(copies) != 2 {
		t.Fatalf("dead-letter topic holds %d records; want 2", len(copies))
	}
	want := map[string]struct{ attempts, err string }{
		"3": {"1", "poison"},
		"7": {"3", "boom"},
	}
	for _, c := range copies {
		off := header(c, idemkafka.HeaderDLQOffset)
		w, ok := want[off]
		if !ok {
			t.Fatalf("dead letter of offset %s; want 3 and 7", off)
		}
		if got := header(c, idemkafka.HeaderDLQAttempts); got != w.attempts {
			t.Errorf("dead letter of offset %s: %s = %q; want %q", off, idemkafka.HeaderDLQAttempts, got, w.attempts)
		}
		if got := header(c, idemkafka.HeaderDLQError); !strings.Contains(got, w.err) {
			t.Errorf("dead letter of offset %s: %s = %q; want it to mention %q", off, idemkafka.HeaderDLQError, got, w.err)
		}
	}
}

// The database fails (not the batch handler): the batch is retried and
// the partition rewound, never applied one record at a time nor
// dead-lettered.
func TestBatchHandlerDatabaseDownRewinds(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 10, 3)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	drv := &flakyDriver[*sqlTx]{Driver: b.open(t)}
	drv.fails.Store(4) // Attempts is 3: one rewind, then success
	in, err := inbox.New[*sqlTx](drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var calls bulkCalls
	inst := startWith(t, drv, in, batchConfig(kc, b, "billing", group, &calls, nil, topic))
	waitFor(t, 20*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.failures != 4 || s.rewound == 0 || s.dead != 0 {
		t.Errorf("stats: %d failures, %d records rewound, %d dead-lettered; want 4 failures, a rewind, none dead-lettered", s.failures, s.rewound, s.dead)
	}
	if sizes, _ := calls.get(); len(sizes) == 0 || sizes[0] < 2 {
		t.Errorf("batch handler calls of sizes %v; want the whole batch once the database is back", sizes)
	}
}

// Exactly one of Handler and BatchHandler.
func TestConsumerConfigBatchHandler(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	drv := b.open(t)
	in, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	handler := func(context.Context, *sqlTx, event.Envelope) error { return nil }
	batch := func(context.Context, *sqlTx, []event.Envelope) error { return nil }
	cfg := func(h func(context.Context, *sqlTx, event.Envelope) error, bh func(context.Context, *sqlTx, []event.Envelope) error) idemkafka.ConsumerConfig[*sqlTx] {
		return idemkafka.ConsumerConfig[*sqlTx]{
			Seeds: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"orders"},
			Handler: h, BatchHandler: bh,
		}
	}
	if _, err := idemkafka.NewConsumer(in, new(cfg(nil, batch))); err != nil {
		t.Errorf("NewConsumer with a BatchHandler only: %v", err)
	}
	if _, err := idemkafka.NewConsumer(in, new(cfg(handler, nil))); err != nil {
		t.Errorf("NewConsumer with a Handler only: %v", err)
	}
	for name, tc := range map[string]struct {
		cfg  idemkafka.ConsumerConfig[*sqlTx]
		want string
	}{
		"both":    {cfg(handler, batch), "both Handler and BatchHandler"},
		"neither": {cfg(nil, nil), "a Handler or a BatchHandler is required"},
	} {
		if _, err := idemkafka.NewConsumer(in, &tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "invalid ConsumerConfig") {
			t.Errorf("%s: NewConsumer = %v; want an invalid ConsumerConfig error mentioning %q", name, err, tc.want)
		}
	}
}
