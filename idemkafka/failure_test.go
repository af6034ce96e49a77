package idemkafka_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testlog"
)

var errBoom = errors.New("boom")

// Records that cannot be applied (a handler that keeps failing, one that
// returns ErrPoison, one that panics, a record that is not an idem event)
// are copied to the dead-letter topic with the error headers, before their
// offsets are committed, and the partition goes on. A failing dead-letter
// topic holds the partition until the copy is acknowledged.
func TestPoisonRecordsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")

	evs := newEvents(t, 8, 2)
	failing, poison, panicking := evs[2], evs[4], evs[6]
	garbage := &kgo.Record{Key: []byte("order-x"), Value: []byte("not an event"),
		Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}, {Key: idemkafka.HeaderDLQError, Value: []byte("an older dead letter")}}}
	rs := recordsOf(topic, evs[:4]...)
	rs = append(rs, garbage)
	rs = append(rs, recordsOf(topic, evs[4:]...)...)
	kc.Produce(t, topic, rs...)
	// Offsets: evs[0..3] 0..3, garbage 4, evs[4..7] 5..8.
	dead := map[int64]struct {
		attempts string
		err      string
	}{
		2: {"3", "boom"},
		4: {"0", "missing header"},
		5: {"1", "poison"},
		7: {"3", "handler panicked"},
	}

	var (
		mu    sync.Mutex
		calls = map[uuid.UUID]int{}
	)
	hook := func(e event.Envelope) error {
		mu.Lock()
		calls[e.ID]++
		mu.Unlock()
		switch e.ID {
		case failing.ID:
			return errBoom
		case poison.ID:
			return fmt.Errorf("unknown product: %w", idemkafka.ErrPoison)
		case panicking.ID:
			panic("nil map")
		}
		return nil
	}
	var dlqFault interface{ Hits() int }
	if !kc.Real() {
		// The first two dead letters are refused: the partition waits.
		dlqFault = kc.Fake(t).Fault(kfakeFault(kmsg.Produce, dlq, kerr.TopicAuthorizationFailed, 2))
	}
	// The commit of a dead letter's offset comes after its copy.
	var early atomic.Value
	checkDLQFirst := func(c *idemkafka.Consumer[*sqlTx]) {
		idemkafka.SetBeforeCommit(c, func(rs []*kgo.Record) {
			copies := kc.EndOffsets(t, dlq)[0]
			want := int64(0)
			for off := range dead {
				if off <= rs[0].Offset {
					want++
				}
			}
			if copies < want {
				early.Store(fmt.Sprintf("committing offset %d with %d dead letters written; want %d", rs[0].Offset, copies, want))
			}
		})
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic), checkDLQFirst)
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	if msg := early.Load(); msg != nil {
		t.Fatal(msg)
	}
	mustOnce(t, b, "billing", []event.Envelope{evs[0], evs[1], evs[3], evs[5], evs[7]})
	if calls[failing.ID] != 3 || calls[poison.ID] != 1 || calls[panicking.ID] != 3 {
		t.Errorf("handler calls: failing %d, poison %d, panicking %d; want 3, 1 (ErrPoison skips the retries), 3",
			calls[failing.ID], calls[poison.ID], calls[panicking.ID])
	}
	if s := inst.stats.get(); s.dead != 4 || s.applied != 5 {
		t.Errorf("stats: dead-lettered %d, applied %d; want 4 and 5", s.dead, s.applied)
	}
	if dlqFault != nil && dlqFault.Hits() != 2 {
		t.Errorf("dead-letter fault hit %d times; want 2", dlqFault.Hits())
	}

	copies := kc.Records(t, dlq)
	if len(copies) != len(dead) {
		t.Fatalf("dead-letter topic holds %d records; want %d", len(copies), len(dead))
	}
	for _, c := range copies {
		off, _ := parseInt(header(c, idemkafka.HeaderDLQOffset))
		want, ok := dead[off]
		if !ok {
			t.Fatalf("dead letter of offset %d; want one of %v", off, dead)
		}
		orig := rs[off]
		if !bytes.Equal(c.Key, orig.Key) || !bytes.Equal(c.Value, orig.Value) {
			t.Errorf("dead letter of offset %d: key %q value %q; want the original %q %q", off, c.Key, c.Value, orig.Key, orig.Value)
		}
		for _, h := range orig.Headers {
			if strings.HasPrefix(h.Key, idemkafka.DLQHeaderPrefix) {
				continue
			}
			if got := header(c, h.Key); got != string(h.Value) {
				t.Errorf("dead letter of offset %d: header %s = %q; want the original %q", off, h.Key, got, h.Value)
			}
		}
		for name, v := range map[string]string{
			idemkafka.HeaderDLQTopic:     topic,
			idemkafka.HeaderDLQPartition: "0",
			idemkafka.HeaderDLQConsumer:  "billing",
			idemkafka.HeaderDLQAttempts:  want.attempts,
		} {
			if got := header(c, name); got != v {
				t.Errorf("dead letter of offset %d: %s = %q; want %q", off, name, got, v)
			}
		}
		if got := header(c, idemkafka.HeaderDLQError); !strings.Contains(got, want.err) {
			t.Errorf("dead letter of offset %d: %s = %q; want it to mention %q", off, idemkafka.HeaderDLQError, got, want.err)
		}
		if n := headerCount(c, idemkafka.HeaderDLQError); n != 1 {
			t.Errorf("dead letter of offset %d has %d %s headers; want 1", off, n, idemkafka.HeaderDLQError)
		}
	}
}

// flakyDriver fails Begin a number of times, as a database that is down.
type flakyDriver[TTx any] struct {
	driver.Driver[TTx]
	fails atomic.Int64
}

var errDBDown = errors.New("connection refused")

func (d *flakyDriver[TTx]) Begin(ctx context.Context) (TTx, error) {
	if d.fails.Add(-1) >= 0 {
		var zero TTx
		return zero, errDBDown
	}
	return d.Driver.Begin(ctx)
}

// The database fails (not the handler): the batch is retried, then the
// partition is rewound and polled again, as long as it takes. Nothing is
// skipped, nothing is dead-lettered.
func TestDatabaseDownRewinds(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 10, 3)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	drv := &flakyDriver[*sqlTx]{Driver: b.open(t)}
	drv.fails.Store(7) // Attempts is 3: two rewinds, then success
	in, err := inbox.New[*sqlTx](drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	inst := startWith(t, drv, in, consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", evs)
	s := inst.stats.get()
	if s.failures != 7 || s.rewound == 0 || s.dead != 0 {
		t.Errorf("stats: %d failures, %d records rewound, %d dead-lettered; want 7 failures, rewinds, none dead-lettered", s.failures, s.rewound, s.dead)
	}
	if n := kc.EndOffsets(t, topic+idemkafka.DeadLetterSuffix)[0]; n != 0 {
		t.Errorf("dead-letter topic holds %d records; want 0", n)
	}
}

// beginClock fails every Begin, as a database that is down, and records
// when each was called.
type beginClock[TTx any] struct {
	driver.Driver[TTx]
	mu    sync.Mutex
	calls []time.Time
}

func (d *beginClock[TTx]) Begin(context.Context) (TTx, error) {
	d.mu.Lock()
	d.calls = append(d.calls, time.Now())
	d.mu.Unlock()
	var zero TTx
	return zero, errDBDown
}

func (d *beginClock[TTx]) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// With Retry.Attempts 1 every failure of the database gives up on the poll
// at once: the partition is rewound and polled again. The next try still
// waits for the backoff, as after any failed try, instead of hammering the
// database (and the broker, and the log) in a tight loop for the length of
// the outage.
func TestDatabaseDownOneAttemptBacksOff(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	kc.Produce(t, topic, recordsOf(topic, newEvents(t, 5, 2)...)...)

	drv := &beginClock[*sqlTx]{Driver: b.open(t)}
	in, err := inbox.New[*sqlTx](drv, &inbox.Config{Consumer: "billing", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	const pause = 200 * time.Millisecond
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Retry = idemkafka.Retry{Attempts: 1, Backoff: func(int) time.Duration { return pause }}
	inst := startWith(t, drv, in, cfg)
	waitFor(t, 30*time.Second, "six tries", func() bool { return len(drv.times()) >= 6 })
	mustStop(t, inst)

	calls := drv.times()[:6]
	for i := 1; i < len(calls); i++ {
		// The backoff is jittered within [pause/2, pause].
		if gap := calls[i].Sub(calls[i-1]); gap < pause/2 {
			t.Errorf("try %d came %v after the one before; want at least %v (Retry.Backoff, jittered)", i+1, gap, pause/2)
		}
	}
	if s := inst.stats.get(); s.applied != 0 || s.dead != 0 || s.rewound == 0 {
		t.Errorf("stats: %d applied, %d dead-lettered, %d rewound; want 0, 0 and rewinds", s.applied, s.dead, s.rewound)
	}
}

// The broker refuses the offset commits: the applied records are
// redelivered to the next consumer and skipped as duplicates.
func TestOffsetCommitRefused(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	evs := newEvents(t, 20, 4)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	fault := fake.Fault(kfakeFault(kmsg.OffsetCommit, "", kerr.GroupAuthorizationFailed, -1))
	first := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every event applied", func() bool { return distinct(t, b, "billing") == len(evs) })
	mustStop(t, first)
	fault.Remove()
	if got := kc.Committed(t, group, topic); len(got) != 0 || fault.Hits() == 0 {
		t.Fatalf("committed %v with the commits refused (%d refusals)", got, fault.Hits())
	}
	if s := first.stats.get(); s.commitFailures == 0 {
		t.Errorf("OnBatch reported no failed commit")
	}

	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
	if s := again.stats.get(); s.applied != 0 || s.duplicates != len(evs) {
		t.Errorf("second consumer applied %d, skipped %d; want 0 and %d", s.applied, s.duplicates, len(evs))
	}
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func headerCount(r *kgo.Record, name string) int {
	n := 0
	for _, h := range r.Headers {
		if h.Key == name {
			n++
		}
	}
	return n
}

// An offset commit that fails is retried while the consumer runs, even when
// the partition gets no new record: the committed offset reaches the end
// (no consumer lag left behind) without a restart or a redelivery.
func TestFailedOffsetCommitRetried(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 10, 2)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	fault := fake.Fault(kfakeFault(kmsg.OffsetCommit, "", kerr.UnknownServerError, 2)) // the first two commits fail
	c := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every event applied", func() bool { return distinct(t, b, "billing") == len(evs) })
	waitFor(t, 15*time.Second, "the offsets committed after the failed commits", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, c)
	if fault.Hits() == 0 {
		t.Fatal("no offset commit failed: the test did not test anything")
	}
	mustOnce(t, b, "billing", evs)
	if s := c.stats.get(); s.applied != len(evs) || s.duplicates != 0 {
		t.Errorf("applied %d, skipped %d; want %d and 0", s.applied, s.duplicates, len(evs))
	}
}

// A consumer stopped while the group coordinator keeps failing offset
// commits (a retriable error, which kgo retries until its retry timeout,
// 30s by default) tries the stop's commit once. The revoke of its Close
// tried the same commit again, and Run returned only after that second
// wait too: a stop during a coordinator outage took about a minute. The
// records are applied once; the next consumer skips them.
func TestStopWhileCommitsFailTriesOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	evs := newEvents(t, 8, 4)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	var (
		mu      sync.Mutex
		seq     []string // what happened, in order
		note    = func(s string) { mu.Lock(); seq = append(seq, s); mu.Unlock() }
		commits atomic.Int64
		stop    atomic.Value // func()
	)
	fault := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.CoordinatorLoadInProgress, Count: -1,
		When: func(kmsg.Request) bool { note("commit request"); return true }})
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.RetryTimeout(time.Second), fastRetry)
	cfg.Logger = slog.New(onMessage{"idemkafka: consumer stopping", func() { note("stopping") }})
	inst := start(t, b, "billing", cfg, func(c *idemkafka.Consumer[*sql.Tx]) {
		idemkafka.SetBeforeCommit(c, func([]*kgo.Record) {
			// The first commit fails (pending); the stop comes just
			// before the next one, which retries it.
			if commits.Add(1) == 2 {
				stop.Load().(func())()
			}
		})
	})
	stop.Store(func() { inst.cancel() })
	select {
	case err := <-inst.done:
		close(inst.done)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s")
	}
	fault.Remove()
	mu.Lock()
	i := slices.Index(seq, "stopping")
	after := 0
	if i >= 0 {
		after = len(seq) - i - 1
	}
	mu.Unlock()
	switch {
	case commits.Load() < 2 || i < 0:
		t.Fatalf("the consumer stopped before its second commit (%d commits, stopping logged: %v)", commits.Load(), i >= 0)
	case i == 0:
		t.Fatal("no offset commit failed: the test did not test anything")
	case after > 0:
		t.Errorf("%d offset commit requests after the stop's commit failed; want none (each retry waits for kgo's retry timeout)", after)
	}
	mustOnce(t, b, "billing", evs)

	again := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, again)
	mustOnce(t, b, "billing", evs)
	if s := again.stats.get(); s.applied != 0 || s.duplicates != len(evs) {
		t.Errorf("second consumer applied %d, skipped %d; want 0 and %d", s.applied, s.duplicates, len(evs))
	}
}

// onMessage is a slog handler that calls fn for each record with message
// msg, and drops every record.
type onMessage struct {
	msg string
	fn  func()
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.fn()
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }

// A handler that panics with an error wrapping ErrPoison is dead-lettered at
// once, as if it had returned that error: the panic's error chain is kept.
func TestPanicWithPoisonDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 3, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	var calls atomic.Int64
	hook := func(e event.Envelope) error {
		if e.ID == evs[1].ID {
			calls.Add(1)
			panic(fmt.Errorf("unknown product: %w", idemkafka.ErrPoison))
		}
		return nil
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	mustOnce(t, b, "billing", []event.Envelope{evs[0], evs[2]})
	if n := calls.Load(); n != 1 {
		t.Errorf("the panicking handler ran %d times; want 1 (its panic wraps ErrPoison)", n)
	}
	copies := kc.Records(t, dlq)
	if len(copies) != 1 {
		t.Fatalf("dead-letter topic holds %d records; want 1", len(copies))
	}
	if got := header(copies[0], idemkafka.HeaderDLQAttempts); got != "1" {
		t.Errorf("%s = %q; want 1", idemkafka.HeaderDLQAttempts, got)
	}
	if got := header(copies[0], idemkafka.HeaderDLQError); !strings.Contains(got, "handler panicked") || !strings.Contains(got, "poison") {
		t.Errorf("%s = %q; want it to name the panic and the poison", idemkafka.HeaderDLQError, got)
	}
}

// NewConsumer reads the user's partition callbacks from a probe client;
// kgo's default revoke callback (commit every polled offset) installed on
// that probe must not run when the consumer's partitions are revoked: the
// consumer commits only what it applied.
func TestRevokeRunsNoDefaultCommit(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	evs := newEvents(t, 6, 3)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.ExtraOpts = append(cfg.ExtraOpts, kgo.WithLogger(kgo.BasicLogger(&logs, kgo.LogLevelDebug, nil)))
	inst := start(t, b, "billing", cfg)
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst) // revokes every partition
	mustOnce(t, b, "billing", evs)

	revoked := false
	for _, l := range strings.Split(logs.String(), "\n") {
		revoked = revoked || strings.Contains(l, "entering OnPartitionsRevoked")
		// The consumer never commits an empty set; kgo's default revoke
		// on the (closed) probe does.
		if strings.Contains(l, "in CommitOffsetsSync") && strings.Contains(l, "with: map[]") {
			t.Errorf("a revoke ran kgo's default offset commit: %s", l)
		}
	}
	if !revoked {
		t.Fatal("no revoke logged: the test did not test anything")
	}
}

// A dead-letter topic that never acknowledges (a retriable error kgo
// retries without end, as for a partition under min.insync.replicas) does
// not hold the consumer: each send is given up after a bounded wait, the
// record's offset is not committed, and stopping the consumer returns at
// once instead of waiting for the acknowledgement forever.
func TestDeadLetterNeverAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	if kc.Real() {
		t.Skip("needs the in-process broker's fault injection")
	}
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")
	fault := kc.Fake(t).Fault(kfakeFault(kmsg.Produce, dlq, kerr.NotEnoughReplicas, 1<<30))

	evs := newEvents(t, 1, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	hook := func(event.Envelope) error { return fmt.Errorf("bad order: %w", idemkafka.ErrPoison) }
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, hook, topic))
	waitFor(t, 30*time.Second, "the dead letter's produce refused", func() bool { return fault.Hits() > 0 })
	time.Sleep(200 * time.Millisecond) // kgo is retrying it
	stopped := make(chan error, 1)
	go func() { stopped <- inst.stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer did not stop while its dead letter was never acknowledged")
	}
	if allCommitted(t, kc, group, topic) {
		t.Fatal("the record's offset was committed without its dead-letter copy")
	}
}

// Stopping the consumer while a dead letter waits for its acknowledgement
// is a stop, not a failure of the dead-letter topic: the record is left for
// the next owner as a database failure is then, with no "retrying" warning
// (nothing is retried) and no failure in the batch's stats.
func TestStopWhileDeadLetterWaitsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	if kc.Real() {
		t.Skip("needs the in-process broker's fault injection")
	}
	topic := kc.Topic(t, "orders", 1)
	dlq := topic + idemkafka.DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	group := kafkatest.Name("g")
	fault := kc.Fake(t).Fault(kfakeFault(kmsg.Produce, dlq, kerr.NotEnoughReplicas, 1<<30))
	kc.Produce(t, topic, recordsOf(topic, newEvents(t, 1, 1)...)...)

	var logs testlog.Buffer
	hook := func(event.Envelope) error { return fmt.Errorf("bad order: %w", idemkafka.ErrPoison) }
	cfg := consumerConfig(kc, b, "billing", group, hook, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	var last atomic.Pointer[idemkafka.BatchStats]
	cfg.OnBatch = func(_ context.Context, s idemkafka.BatchStats) { last.Store(&s) }
	inst := start(t, b, "billing", cfg)
	waitFor(t, 30*time.Second, "the dead letter's produce refused", func() bool { return fault.Hits() > 0 })
	mustStop(t, inst)

	if strings.Contains(logs.String(), "batch failed; retrying") {
		t.Errorf("a stop was logged as a failure retried:\n%s", logs.String())
	}
	s := last.Load()
	if s == nil {
		t.Fatal("no batch reported")
	}
	if s.Failures != 1 || s.Rewound != 1 || s.DeadLettered != 0 || !errors.Is(s.Err, idemkafka.ErrPoison) {
		t.Errorf("stats: %d failures, %d rewound, %d dead-lettered, err %v; want the handler's 1 failure (ErrPoison), 1 rewound, none dead-lettered",
			s.Failures, s.Rewound, s.DeadLettered, s.Err)
	}
}

// The warning for a poison record (its handler returned ErrPoison) says it
// is dead-lettered, with no try count: it was logged as "try 1 of 3", as
// if it were to be retried. A record that keeps failing still counts its
// tries.
func TestPoisonRecordLoggedAsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 3, 1)
	failing, poison := evs[0], evs[1]
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	var logs testlog.Buffer
	hook := func(e event.Envelope) error {
		switch e.ID {
		case failing.ID:
			return errBoom
		case poison.ID:
			return fmt.Errorf("bad order: %w", idemkafka.ErrPoison)
		}
		return nil
	}
	cfg := consumerConfig(kc, b, "billing", group, hook, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	inst := start(t, b, "billing", cfg)
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)

	var poisonLines, failingTries []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(l, "idemkafka: handler failed") {
			continue
		}
		switch {
		case strings.Contains(l, "event_id="+poison.ID.String()):
			poisonLines = append(poisonLines, l)
		case strings.Contains(l, "event_id="+failing.ID.String()):
			failingTries = append(failingTries, l)
		}
	}
	if len(poisonLines) != 1 {
		t.Fatalf("%d handler warnings for the poison record; want 1:\n%s", len(poisonLines), logs.String())
	}
	if l := poisonLines[0]; strings.Contains(l, " try=") || strings.Contains(l, " of=") || !strings.Contains(l, "dead-lettering") {
		t.Errorf("the poison record's warning: %s\nwant it dead-lettered, with no try count", l)
	}
	if len(failingTries) != 3 {
		t.Fatalf("%d handler warnings for the failing record; want 3:\n%s", len(failingTries), logs.String())
	}
	for i, l := range failingTries {
		if want := fmt.Sprintf(" try=%d of=3 ", i+1); !strings.Contains(l, want) {
			t.Errorf("the failing record's warning %d: %s\nwant%s", i+1, l, want)
		}
	}
}

// Events a transactional producer wrote and then aborted never happened:
// the consumer applies the committed ones only.
func TestAbortedTransactionNotApplied(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 3, 1)
	kc.Produce(t, topic, recordsOf(topic, evs[0])...)
	txp := kc.Client(t, kgo.TransactionalID(kafkatest.Name("tx")), kgo.DefaultProduceTopic(topic))
	for _, commit := range []bool{false, true} {
		if err := txp.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		e := evs[1]
		if commit {
			e = evs[2]
		}
		if err := txp.ProduceSync(t.Context(), recordsOf(topic, e)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := txp.EndTransaction(t.Context(), kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	inst := start(t, b, "billing", consumerConfig(kc, b, "billing", group, nil, topic))
	// The committed event comes after the aborted one in the log: once it
	// is applied, the aborted one was skipped or applied.
	waitFor(t, 30*time.Second, "the committed transaction's event applied", func() bool {
		for _, r := range b.rows(t, "billing") {
			if r.ID == evs[2].ID {
				return true
			}
		}
		return false
	})
	mustStop(t, inst)
	mustOnce(t, b, "billing", []event.Envelope{evs[0], evs[2]})
}

// While the group cannot be joined (a broker outage), kgo's group loop
// fails at each try and calls OnPartitionsLost with what the member holds:
// nothing, after the first failure. The consumer logs "partitions lost"
// only when it lost some: a WARN with an empty map at every try was noise
// that the runbook reads as a group rebalancing too often.
func TestJoinFailuresLogNoEmptyLoss(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 1)
	group := kafkatest.Name("g")
	evs := newEvents(t, 2, 2)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	fault := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	inst := start(t, b, "billing", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fault.Wait(ctx, 3); err != nil {
		t.Fatalf("the joins were not refused three times: %v", err)
	}
	fault.Remove()
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)

	var failed int
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "partitions lost") && strings.Contains(l, "partitions=map[]") {
			t.Errorf("logged a loss of no partition: %s", l)
		}
		if strings.Contains(l, "idemkafka: fetch failed") {
			failed++
		}
	}
	if failed == 0 {
		t.Fatalf("no failed join logged: the test did not test anything\n%s", logs.String())
	}
}

// A run of refused joins (a Kafka outage: the group loop fails every 1-4 s)
// is one failure: one ERROR when it starts, repeats counted and not logged
// within 30 s, and one INFO, with the count, when the group is joined
// again; then the records are applied. It was an ERROR per try for the
// whole outage.
func TestJoinFailuresLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", 2)
	group := kafkatest.Name("g")
	evs := newEvents(t, 2, 3)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)

	fault := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	var logs testlog.Buffer
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	inst := start(t, b, "billing", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fault.Wait(ctx, 4); err != nil {
		t.Fatalf("the joins were not refused four times: %v", err)
	}
	fault.Remove()
	waitFor(t, 30*time.Second, "every partition committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)

	var failed, still, joined []string
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "idemkafka: fetch failed"):
			failed = append(failed, l)
		case strings.Contains(l, "idemkafka: fetch still failing"):
			still = append(still, l)
		case strings.Contains(l, "idemkafka: group joined again after failures"):
			joined = append(joined, l)
		}
	}
	if len(failed) != 1 || !strings.Contains(failed[0], "level=ERROR") || !strings.Contains(failed[0], "UNKNOWN_SERVER_ERROR") {
		t.Errorf("fetch failed lines: %q; want one ERROR naming the join's error", failed)
	}
	if len(still) != 0 {
		t.Errorf("repeats logged within 30 s: %q", still)
	}
	if len(joined) != 1 || !strings.Contains(joined[0], "level=INFO") || strings.Contains(joined[0], "failures=1 ") {
		t.Errorf("recovery lines: %q; want one INFO counting the failed tries (at least 2 of the 4 refused joins)", joined)
	}
	if t.Failed() {
		t.Log(logs.String())
	}
}
