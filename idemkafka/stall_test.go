package idemkafka_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

// logLine is one line a recordLog kept.
type logLine struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

// recordLog is a slog handler that keeps every line at INFO and above.
type recordLog struct {
	mu    *sync.Mutex
	lines *[]logLine
}

func newRecordLog() recordLog { return recordLog{mu: &sync.Mutex{}, lines: &[]logLine{}} }

func (h recordLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h recordLog) Handle(_ context.Context, r slog.Record) error {
	l := logLine{at: r.Time, level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, l)
	h.mu.Unlock()
	return nil
}
func (h recordLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordLog) WithGroup(string) slog.Handler      { return h }

// find returns the lines with a message starting with prefix.
func (h recordLog) find(prefix string) []logLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logLine
	for _, l := range *h.lines {
		if strings.HasPrefix(l.msg, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// since counts the lines at WARN and above logged after t.
func (h recordLog) since(t time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, l := range *h.lines {
		if l.level >= slog.LevelWarn && l.at.After(t) {
			n++
		}
	}
	return n
}

// One record whose own statement always hits lock_timeout (55P03: a row
// locked by a transaction that never ends) stalls its partition for good:
// a database fault is never dead-lettered. The consumer says so at ERROR
// once the partition has not moved for the stall bound (with the topic,
// partition, offset, event ID and cause), then at most once per bound,
// Stalled reports it for a gauge, and the per-try warnings stop; once the
// lock is released the record is applied once, nothing is dead-lettered,
// and an INFO line ends the incident. Before, the consumer logged three
// WARN lines per try round for ever (about 15 a second here) and never an
// ERROR, and nothing measured the stall.
func TestStalledPartitionReported(t *testing.T) {
	t.Parallel()
	b, holder := stuckLock(t)
	ctx := t.Context()

	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 3, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	stuck := evs[1] // offset 1

	logs := newRecordLog()
	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.Logger = slog.New(logs)
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		if e.ID == stuck.ID {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT id FROM stall_lock WHERE id = 1 FOR UPDATE`); err != nil {
				return err
			}
		}
		return b.effect(ctx, tx, "billing", e)
	}
	const bound = 500 * time.Millisecond
	var c *idemkafka.Consumer[pgx.Tx]
	inst := start(t, b, "billing", cfg, func(cc *idemkafka.Consumer[pgx.Tx]) {
		c = cc
		idemkafka.SetStallAfter(c, bound)
	})

	const stalledMsg = "idemkafka: partition stalled"
	waitFor(t, 20*time.Second, "the stall's ERROR", func() bool { return len(logs.find(stalledMsg)) > 0 })
	first := logs.find(stalledMsg)[0]
	if first.level != slog.LevelError {
		t.Errorf("stall logged at %v; want ERROR", first.level)
	}
	want := map[string]string{"topic": topic, "partition": "0", "offset": "1", "event_id": stuck.ID.String()}
	for k, v := range want {
		if first.attrs[k] != v {
			t.Errorf("stall line: %s=%q; want %q (%v)", k, first.attrs[k], v, first.attrs)
		}
	}
	if !strings.Contains(first.attrs["err"], "55P03") {
		t.Errorf("stall line's err %q does not name the cause (55P03)", first.attrs["err"])
	}
	if s := c.Stalled(); s < bound {
		t.Errorf("Stalled() = %v while the partition is stalled; want at least %v", s, bound)
	}

	// Bounded log volume while it lasts.
	from := time.Now()
	const window = 3 * time.Second
	time.Sleep(window)
	lines := logs.since(from)
	t.Logf("%d WARN/ERROR lines in %v of a stalled partition", lines, window)
	if limit := int(window/bound) + 2; lines > limit {
		t.Errorf("%d WARN/ERROR lines in %v of a stalled partition; want at most %d (one ERROR per %v)", lines, window, limit, bound)
	}
	if s := c.Stalled(); s < window {
		t.Errorf("Stalled() = %v after %v stalled; want it to grow", s, window)
	}

	// The lock goes: the partition moves on, every event applied once.
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) })
	waitFor(t, 30*time.Second, "the stall's end", func() bool { return len(logs.find("idemkafka: partition moves again")) > 0 })
	if s := c.Stalled(); s != 0 {
		t.Errorf("Stalled() = %v after the partition moved on; want 0", s)
	}
	mustStop(t, inst)
	mustOnce(t, b, "billing", evs)
	if s := inst.stats.get(); s.dead != 0 {
		t.Errorf("%d dead-lettered; want 0 (a database fault is never the record's)", s.dead)
	}
}

// A consumer stopped while a partition is stalled owns no partition any
// more, a static member's (which does not leave the group) included:
// Stalled reports 0, not a stall that grows for ever on a gauge of a
// consumer that is gone (the next owner reports it).
func TestStalledClearedAtStop(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 1, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	hook := func(event.Envelope) error {
		return &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	}
	cfg := consumerConfig(kc, b, "billing", group, hook, topic)
	cfg.InstanceID = "replica-0" // a static member does not leave the group when it stops
	var c *idemkafka.Consumer[*sql.Tx]
	inst := start(t, b, "billing", cfg, func(cc *idemkafka.Consumer[*sql.Tx]) { c = cc })
	waitFor(t, 20*time.Second, "a stall", func() bool { return c.Stalled() > 0 })
	mustStop(t, inst)
	if s := c.Stalled(); s != 0 {
		t.Errorf("Stalled() = %v after Run returned; want 0", s)
	}
}

// Once a partition is stalled (a poll's Retry.Attempts tries of its next
// record all failed on a database fault), each later poll tries it once
// before rewinding it, not Retry.Attempts times: every try of a record
// stuck on a lock holds the consumer's other partitions up for as long as
// the lock wait, and the retries of a fault that lasts would only repeat
// it. Before, every poll tried it 5 times (with their backoffs) again.
func TestStalledPartitionTriedOncePerPoll(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 1)
	evs := newEvents(t, 1, 1)
	kc.Produce(t, topic, recordsOf(topic, evs...)...)
	hook := func(event.Envelope) error {
		return &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	}
	cfg := consumerConfig(kc, b, "billing", group, hook, topic)
	cfg.Retry = idemkafka.Retry{Attempts: 5, Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	var (
		mu    sync.Mutex
		tries []int // failed tries of each poll of the partition
	)
	cfg.OnBatch = func(_ context.Context, s idemkafka.BatchStats) {
		mu.Lock()
		defer mu.Unlock()
		tries = append(tries, s.Failures)
	}
	inst := start(t, b, "billing", cfg)
	waitFor(t, 20*time.Second, "5 polls", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(tries) >= 5
	})
	mustStop(t, inst)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("failed tries per poll: %v", tries)
	if tries[0] != 5 {
		t.Errorf("first poll: %d failed tries; want Retry.Attempts (5)", tries[0])
	}
	for i, n := range tries[1 : len(tries)-1] { // the last one may be cut short by the stop
		if n != 1 {
			t.Errorf("poll %d of the stalled partition: %d failed tries; want 1", i+2, n)
		}
	}
}

// A stalled partition does not hold up the consumer's other partitions
// for long. One record waits on a row lock held by a stuck transaction
// (each try costs the lock wait, 300ms here, then fails with 55P03, and is
// retried for ever); the other partition's 300 records are polled 5 at a
// time. Each try of the stuck record holds the poll it is in for the lock
// wait, but the rewound partition is fetched again only after the
// client's buffered records of the other one: measured 3 or 4 tries while
// the 300 records were applied in 1.4-2.2s (3,000 records with polls of
// 500: 1.2-2.2s, 3 tries). Were the stuck record tried at every poll, the
// 60 polls would take over 18s. Once the lock goes, the stuck record is
// applied, once, and nothing is dead-lettered.
func TestStalledPartitionDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	b, holder := stuckLock(t)
	ctx := t.Context()

	kc := kafkatest.New(t)
	topic, group := consumedTopic(t, kc, 2)
	stuck := newEvents(t, 1, 1)[0]
	healthy := newEvents(t, 300, 30)
	prod := kc.Client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	rs := []*kgo.Record{idemkafka.Record(topic, stuck)}
	rs[0].Partition = 0
	for _, e := range healthy {
		r := idemkafka.Record(topic, e)
		r.Partition = 1
		rs = append(rs, r)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := prod.ProduceSync(pctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	cfg := consumerConfig(kc, b, "billing", group, nil, topic)
	cfg.MaxPollRecords = 5
	var stuckTries atomic.Int32
	cfg.Retry = idemkafka.Retry{Attempts: 2, Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, e event.Envelope) error {
		if e.ID == stuck.ID {
			stuckTries.Add(1)
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '300ms'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT id FROM stall_lock WHERE id = 1 FOR UPDATE`); err != nil {
				return err
			}
		}
		return b.effect(ctx, tx, "billing", e)
	}
	watch := stallmeter.Start(t) // seconds without CPU are the machine's
	started := time.Now()
	inst := start(t, b, "billing", cfg)
	waitFor(t, 60*time.Second, "the healthy partition's records applied", func() bool {
		return distinct(t, b, "billing") >= len(healthy)
	})
	took, stalled := time.Since(started), watch.Stop()
	t.Logf("the healthy partition's %d records applied in %v beside a stalled partition (%d tries of the stuck record; the process stalled %v)", len(healthy), took, stuckTries.Load(), stalled)
	if took > 10*time.Second+stalled {
		t.Errorf("the healthy partition's %d records took %v beside a stalled partition (each try of which waits 300ms); want well under 10s, plus the %v the process stalled: a stalled partition must not hold up the others", len(healthy), took, stalled)
	}

	// The lock goes: the stuck record is applied, once.
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "committed", func() bool { return allCommitted(t, kc, group, topic) })
	mustStop(t, inst)
	mustOnce(t, b, "billing", append([]event.Envelope{stuck}, healthy...))
	if s := inst.stats.get(); s.dead != 0 {
		t.Errorf("%d dead-lettered; want 0 (a database fault is never the record's)", s.dead)
	}
}

// stuckLock returns a PostgreSQL backend with a table stall_lock whose one
// row (id 1) is held by holder, a transaction that stays open until it is
// rolled back (at the latest when the test ends): a stuck transaction.
func stuckLock(t *testing.T) (*backend[pgx.Tx], pgx.Tx) {
	t.Helper()
	_, schema := testdb.Schema(t, 1)
	b := postgresAt(t, schema, true)
	admin := testdb.Pool(t, schema, 2)
	ctx := t.Context()
	if _, err := admin.Exec(ctx, `CREATE TABLE stall_lock (id int PRIMARY KEY); INSERT INTO stall_lock VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	holder, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	if _, err := holder.Exec(ctx, `SELECT id FROM stall_lock WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return b, holder
}
