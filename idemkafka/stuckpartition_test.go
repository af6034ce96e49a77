package idemkafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// stuckScenario is a steady load through a PostgreSQL outbox and a relay
// with RelayConfig's defaults into a topic of 6 partitions on 3 kfake
// brokers, one of which leads a single partition and stops answering
// produce requests for a while (a broker that hangs, a partition whose
// leader is gone): what the relay publishes for the other partitions before
// and during that fault, and whether every event reaches the topic, each key
// in order, once the broker answers again.
type stuckScenario struct {
	rate                  int           // events enqueued per second
	keys                  int           // keys the events are spread over
	before, during, after time.Duration // healthy, stuck, healthy again
}

type stuckResult struct {
	beforeRate, duringRate float64 // events of the healthy partitions published per second
	perSecond              []int64 // healthy events published in each second of the fault
	enqueued               int
	records, duplicates    int
	drain                  time.Duration // from the heal until every event is published, the process's stalls left out
	backlog                int           // events not published at the heal
	allRate                float64       // events published per second before the fault
}

const (
	stuckPartitions = 6
	stuckPartition  = 5
	stuckNode       = 2
)

// stuckBackend is the outbox a stuck scenario runs on.
type stuckBackend[TTx any] struct {
	drv     driver.Driver[TTx]
	pending func(t *testing.T) int // events not published yet
}

func stuckPostgres(t *testing.T) stuckBackend[pgx.Tx] {
	t.Helper()
	testdb.RequirePostgres(t)
	_, schema := testdb.Schema(t, 1)
	drv, err := pgdriver.New(testdb.Pool(t, schema, 8), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return stuckBackend[pgx.Tx]{drv: drv, pending: func(t *testing.T) int {
		var n int
		if err := drv.Pool().QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "outbox_pending"}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}}
}

func stuckSQLite(t *testing.T) stuckBackend[*sql.Tx] {
	t.Helper()
	drv := setupSQLite(t).open(t).(*sqlitedriver.Driver)
	return stuckBackend[*sql.Tx]{drv: drv, pending: func(t *testing.T) int {
		var n int
		if err := drv.DB().QueryRowContext(t.Context(), "SELECT count(*) FROM outbox WHERE published_at IS NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}}
}

func runStuckScenario[TTx any](t *testing.T, b stuckBackend[TTx], sc stuckScenario) stuckResult {
	t.Helper()
	kc := kafkatest.New(t, kfake.NumBrokers(3))
	fake := kc.Fake(t)
	topic := kc.Topic(t, "orders", stuckPartitions)
	// The stuck partition alone on node 2; the others on nodes 0 and 1.
	for p := range int32(stuckPartitions) {
		node := p % 2
		if p == stuckPartition {
			node = stuckNode
		}
		if err := fake.MoveTopicPartition(topic, p, node); err != nil {
			t.Fatal(err)
		}
	}
	var stuck atomic.Bool
	var swallowed atomic.Int64
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if stuck.Load() && fake.CurrentNode() == stuckNode {
			swallowed.Add(1)
			return nil, nil, true // never answered: the client times out and retries
		}
		return nil, nil, false
	})

	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	partOf := func(key string) int32 {
		return int32(part.Partition(&kgo.Record{Key: []byte(key)}, stuckPartitions))
	}
	healthyKey := make(map[string]bool, sc.keys)
	for k := range sc.keys {
		key := fmt.Sprintf("order-%d", k)
		healthyKey[key] = partOf(key) != stuckPartition
	}

	drv := b.drv
	// kfake never answers a produce request it swallowed: kgo learns the
	// outcome of its records when the request times out (its default
	// ProduceRequestTimeout plus RequestTimeoutOverhead is 20s), and
	// retries it. A broker that resumes answers it, or closes the
	// connection; the short timeouts and retries stand for that: the
	// records resolve within about 2s of the heal.
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(),
		ExtraOpts: []kgo.Opt{fastRetry, kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second)}})
	var healthy, all atomic.Int64
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Logger: testLogger(),
		OnPublished: func(evs []event.Envelope) {
			n := 0
			for _, e := range evs {
				if healthyKey[e.Key] {
					n++
				}
			}
			healthy.Add(int64(n))
			all.Add(int64(len(evs)))
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	// The load: every 10ms a transaction of rate/100 events, over the keys
	// in turn; payload n is the event's position in its key.
	var (
		mu  sync.Mutex
		evs []event.Envelope
	)
	loadCtx, stopLoad := context.WithCancel(t.Context())
	var loadWG sync.WaitGroup
	loadWG.Go(func() {
		seq := make([]int, sc.keys)
		next := 0
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			batch := make([]event.Envelope, max(sc.rate/100, 1))
			for i := range batch {
				k := next % sc.keys
				next++
				seq[k]++
				e, err := event.New("OrderCreated.v1", fmt.Sprintf("order-%d", k), payload{N: seq[k]})
				if err != nil {
					t.Error(err)
					return
				}
				batch[i] = e
			}
			// Not on loadCtx: a commit cancelled as it went through would
			// leave an event in the outbox that the check does not know.
			ctx := context.Background()
			tx, err := drv.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if err := outbox.EnqueueTx(ctx, drv, tx, batch...); err != nil {
				_ = drv.Rollback(ctx, tx)
				t.Error(err)
				return
			}
			if err := drv.Commit(ctx, tx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			evs = append(evs, batch...)
			mu.Unlock()
		}
	})
	t.Cleanup(func() { stopLoad(); loadWG.Wait() })

	runCtx, stopRun := context.WithCancel(context.Background())
	var runWG sync.WaitGroup
	runWG.Go(func() { _ = relay.Run(runCtx) })
	stopRelay := sync.OnceFunc(func() { stopRun(); runWG.Wait() })
	t.Cleanup(stopRelay)

	// The rates count the seconds the process ran: a busy machine stalls
	// it for seconds at times (the load and the relay with it), and a
	// stall in one phase and not the other compares the machine, not the
	// relay (per second during the fault: [13 0 32 0 83 ...] in a failed
	// run). The meter counts a stall when it ends: one that began before
	// a phase counts whole in it, and a phase of 2s once "ran" 0.1s
	// (2.52s stalled), which made its rate ten times what the relay
	// published (1140 events/s). A phase counts at least half its length.
	watch := stallmeter.Start(t)
	ran := func(from, to time.Time, stalledFrom, stalledTo time.Duration) float64 {
		wall := to.Sub(from)
		return max(wall-(stalledTo-stalledFrom), wall/2).Seconds()
	}
	var res stuckResult
	time.Sleep(sc.before / 2) // warm up
	h0, a0, t0, s0 := healthy.Load(), all.Load(), time.Now(), watch.Stalled()
	time.Sleep(sc.before / 2)
	h1, a1, t1, s1 := healthy.Load(), all.Load(), time.Now(), watch.Stalled()
	res.beforeRate = float64(h1-h0) / ran(t0, t1, s0, s1)
	res.allRate = float64(a1-a0) / ran(t0, t1, s0, s1)
	t.Logf("before the fault: %.0f events/s published, %.0f of the healthy partitions (the process stalled %v)", res.allRate, res.beforeRate, s1-s0)

	stuck.Store(true)
	t.Logf("fault on: node %d answers no produce request (partition %d)", stuckNode, stuckPartition)
	last := h1
	for end := time.Now().Add(sc.during); time.Now().Before(end); {
		time.Sleep(min(time.Second, time.Until(end)))
		h := healthy.Load()
		res.perSecond = append(res.perSecond, h-last)
		last = h
	}
	h2, t2, s2 := healthy.Load(), time.Now(), watch.Stalled()
	// The first StragglerTimeout of the fault (2s by default) publishes
	// next to nothing by design: the rounds then in flight wait that long
	// for the stuck partition's records before they give up on them
	// ([19 0 1391 368 ...] per second in a CI run). The relay's speed
	// during the fault is what it publishes over the rest of it, the
	// backlog of those seconds included: counted over the whole fault, a
	// loaded machine's run failed (59 events/s against a bound of 67: [0 0
	// 103 117 77 19 37 27 68 61 0 0], the process stalled 3.4s). A relay
	// whose rounds wait for the stuck partition publishes next to nothing
	// either way.
	res.duringRate = float64(h2-h1) / max(ran(t1, t2, s1, s2)-idemkafka.DefaultStragglerTimeout.Seconds(), 0.1)
	stuck.Store(false)
	healedAt := time.Now()
	res.backlog = b.pending(t)
	t.Logf("fault off after %s: %d produce requests swallowed", sc.during, swallowed.Load())
	time.Sleep(sc.after)
	stopLoad()
	loadWG.Wait()
	mu.Lock()
	want := slices.Clone(evs)
	mu.Unlock()
	res.enqueued = len(want)
	t.Logf("healthy partitions: %.0f events/s before the fault, %.0f events/s during it (the process stalled %v); per second during it: %v",
		res.beforeRate, res.duringRate, s2-s1, res.perSecond)
	healed := time.Now()
	waitFor(t, 3*time.Minute, "every event published", func() bool { return b.pending(t) == 0 })
	res.drain = time.Since(healedAt) - (watch.Stalled() - s2) // the seconds the process ran
	t.Logf("every event published %s after the load stopped, %s after the heal (%d events pending at the heal)",
		time.Since(healed).Round(time.Millisecond), res.drain.Round(time.Millisecond), res.backlog)
	stopRelay()
	rs := kc.Records(t, topic)
	res.records = len(rs)
	res.duplicates = mustPublishedAtLeastOnce(t, rs, want)
	return res
}

// mustPublishedAtLeastOnce checks that rs hold every event of evs, intact,
// at least once, and that in every partition the first copies of a key's
// events are in the order given (a later copy of an event the topic already
// holds is a duplicate a consumer's inbox drops). It returns the number of
// duplicates.
func mustPublishedAtLeastOnce(t *testing.T, rs []*kgo.Record, evs []event.Envelope) int {
	t.Helper()
	pos := make(map[uuid.UUID]int, len(evs)) // index within its key
	byKey := map[string]int{}
	for _, e := range evs {
		pos[e.ID] = byKey[e.Key]
		byKey[e.Key]++
	}
	seen := make(map[uuid.UUID]bool, len(evs))
	next := map[string]int{} // the key's next event expected for the first time
	dups := 0
	for _, r := range rs { // partition, then offset order
		e, err := idemkafka.Envelope(r)
		if err != nil {
			t.Fatalf("record %d/%d: %v", r.Partition, r.Offset, err)
		}
		i, ok := pos[e.ID]
		switch {
		case !ok:
			t.Fatalf("record of unknown event %s", e.ID)
		case seen[e.ID]:
			dups++
			continue
		case i != next[e.Key]:
			t.Fatalf("key %s: event %d (%s) first published at %d/%d before event %d", e.Key, i, e.ID, r.Partition, r.Offset, next[e.Key])
		}
		seen[e.ID] = true
		next[e.Key]++
	}
	if len(seen) != len(evs) {
		t.Fatalf("%d of %d events published", len(seen), len(evs))
	}
	return dups
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err == nil {
			return d
		}
	}
	return def
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// One partition's leader stops answering produce requests: the relay keeps
// publishing the events of the other partitions at about the speed it had
// before, and once the broker answers again every event is in the topic,
// each key's events first published in order, at once (the relay learns
// the outcome of the records the publisher gave up waiting for, see
// outbox.LatePublisher: the stuck keys do not wait out their backoff, up to
// a minute), and once (those records were written: their events are marked
// published, not published again). IDEMKAFKA_STUCK_* set the
// load and the phases (for a measurement by hand).
func TestRelayStuckPartition(t *testing.T) {
	t.Parallel()
	sc := stuckScenario{
		rate:   envInt("IDEMKAFKA_STUCK_RATE", 1000),
		keys:   envInt("IDEMKAFKA_STUCK_KEYS", 1000),
		before: envDuration("IDEMKAFKA_STUCK_BEFORE", 4*time.Second),
		during: envDuration("IDEMKAFKA_STUCK_DURING", 12*time.Second),
		after:  envDuration("IDEMKAFKA_STUCK_AFTER", time.Second),
	}
	// want is the least share of the healthy partitions' speed kept during
	// the fault. On SQLite every claim steps over the stuck partition's
	// backlog, which grows with the fault (the oldest pending events): its
	// relay slows down as the fault lasts, but keeps publishing.
	check := func(t *testing.T, res stuckResult, want float64) {
		t.Logf("%d events enqueued; %d records in the topic, %d duplicates", res.enqueued, res.records, res.duplicates)
		// The records the publisher gave up on resolve within 2s of the
		// heal (see runStuckScenario); the relay then marks the written
		// ones published and the keys drain at once. Before it learned
		// those outcomes, each stuck key waited for its backoff (up to a
		// minute) and its records that had been written were published
		// again: 19s after the heal and 159 duplicates in this test, 64s
		// after a fault of 45s. The records kgo held unsent behind the
		// stuck ones are sent after the heal and reported published:
		// given up as kgo sent them (their Publish's context ended) and
		// left to their backoff, their keys waited 10s after the heal in
		// a CI run, 5-9s in a reproduction.
		// The bound: the records' outcomes (about 2s), then the backlog
		// at the heal published at half the relay's speed before the
		// fault, or the end of the load and a round; 6s of slack for a
		// loaded machine (the whole suite and more on 2 cores: 6.97s
		// against a bound of 4s + 2.76s), far below the 19s the stuck
		// keys took before.
		work := time.Duration(2 * float64(res.backlog) / res.allRate * float64(time.Second))
		if limit := 6*time.Second + max(work, sc.after+time.Second); res.drain > limit {
			t.Errorf("every event published %s after the heal; want within %s", res.drain.Round(time.Millisecond), limit)
		} else {
			t.Logf("every event published %s after the heal, within %s", res.drain.Round(time.Millisecond), limit)
		}
		// The publisher reports an event written after all published
		// without a new record when the relay hands it over again before
		// marking it: no duplicate.
		if res.duplicates > 0 {
			t.Errorf("%d events published twice; want at most a few (the records written after the publisher gave up on them are marked published, not published again)", res.duplicates)
		}
		if res.duringRate < want*res.beforeRate {
			t.Errorf("healthy partitions published %.0f events/s during the fault; want at least %.0f%% of the %.0f events/s before it",
				res.duringRate, 100*want, res.beforeRate)
		}
	}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		check(t, runStuckScenario(t, stuckPostgres(t), sc), 0.5)
	})
	if os.Getenv("IDEMKAFKA_STUCK_BACKEND") != "postgres" {
		t.Run("sqlite", func(t *testing.T) {
			t.Parallel()
			check(t, runStuckScenario(t, stuckSQLite(t), sc), 0.2)
		})
	}
}

// Publish returns StragglerTimeout after the broker acknowledged the
// records of the healthy partition, reporting those of the partition whose
// leader does not answer as ErrOutcomeUnknown; a later event of such a key
// fails at once, without a record, while the first ones wait in the client;
// once the broker answers, PublishLate's callback tells that the first ones
// were written (not the later one, which had no record), and handed over
// again, the first ones are reported published without a new record: the
// key's events are all in the topic, in order, once each.
func TestPublishStuckPartitionStraggler(t *testing.T) {
	t.Parallel()
	kc, topic, stuck, keysIn, ev := stuckTopic(t)
	a, b := keysIn(0, 1)[0], keysIn(1, 1)[0]
	a1, b1, b2, a2, b3, a3 := ev(a, 1), ev(b, 1), ev(b, 2), ev(a, 2), ev(b, 3), ev(a, 3)
	const straggler = 300 * time.Millisecond
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(), StragglerTimeout: straggler,
		ExtraOpts: []kgo.Opt{fastRetry, kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second)}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	type lateOutcome struct {
		i   int
		err error
	}
	lateCh := make(chan lateOutcome, 10)
	start := time.Now()
	err := pub.PublishLate(ctx, []event.Envelope{a1, b1, b2, a2}, func(i int, err error) { lateCh <- lateOutcome{i, err} })
	took := time.Since(start)
	errs := publishErrs(t, err, 4)
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("events of the healthy partition: %v, %v; want published", errs[0], errs[3])
	}
	for _, i := range []int{1, 2} {
		if !errors.Is(errs[i], idemkafka.ErrOutcomeUnknown) {
			t.Fatalf("event %d of the stuck partition: %v; want ErrOutcomeUnknown", i, errs[i])
		}
	}
	if took > 10*time.Second {
		t.Fatalf("Publish took %s with one partition stuck; want about StragglerTimeout (%s)", took, straggler)
	}
	t.Logf("Publish returned after %s", took)

	// The key whose records wait fails at once; the other key goes on.
	start = time.Now()
	errs = publishErrs(t, pub.Publish(ctx, []event.Envelope{b3, a3}), 2)
	if !errors.Is(errs[0], idemkafka.ErrOutcomeUnknown) || errs[1] != nil {
		t.Fatalf("with the key's records waiting: %v, %v; want ErrOutcomeUnknown and published", errs[0], errs[1])
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Publish of a waiting key took %s; want at once", took)
	}

	select {
	case o := <-lateCh:
		t.Fatalf("late outcome of event %d while its partition does not answer: %v", o.i, o.err)
	default:
	}

	// Once the broker answers, the abandoned records' outcomes come, in
	// order (b1, then b2): both published; the key is free again.
	stuck.Store(false)
	for _, want := range []int{1, 2} {
		select {
		case o := <-lateCh:
			if o.i != want || o.err != nil {
				t.Fatalf("late outcome: event %d, %v; want event %d published", o.i, o.err, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no late outcome for event %d within 30s of the heal", want)
		}
	}
	// Handed over again before the relay marked them (a round that claimed
	// them as their outcome came), b1 and b2 are reported published
	// without a new record; b3 is produced.
	if err := pub.Publish(ctx, []event.Envelope{b1, b2, b3}); err != nil {
		t.Fatalf("the key's events after the late outcomes: %v", err)
	}
	if dups := mustPublishedAtLeastOnce(t, kc.Records(t, topic), []event.Envelope{a1, b1, b2, a2, b3, a3}); dups > 0 {
		t.Errorf("%d duplicates; want none", dups)
	}
}

func publishErrs(t *testing.T, err error, n int) []error {
	t.Helper()
	var pe *outbox.PublishError
	if !errors.As(err, &pe) || len(pe.Errs) != n {
		t.Fatalf("Publish: %v; want a PublishError for %d events", err, n)
	}
	return pe.Errs
}

// A record buffered behind the ones a partition that does not answer holds
// in flight is sent once the partition answers again, though its Publish's
// context ended meanwhile (the relay ends a round's context as Publish
// returns), and PublishLate reports it published: its key goes on at once,
// without a copy. kgo gave such a record up as it sent it (its context
// ended), which failed the records of other calls buffered behind it (see
// TestPublishStuckPartitionGivenUpRecordKeepsOthersOrder); left to its
// backoff (up to a minute, grown with the fault), its key had stood still
// after the heal (10 s in a run of TestRelayStuckPartition whose bound was
// 8.5 s).
func TestPublishStuckPartitionBufferedWrittenOnHeal(t *testing.T) {
	t.Parallel()
	kc, topic, stuck, keysIn, ev := stuckTopic(t)
	healthy, stuckKeys := keysIn(0, 1)[0], keysIn(1, 2)
	a1, b1, a2, c1 := ev(healthy, 1), ev(stuckKeys[0], 1), ev(healthy, 2), ev(stuckKeys[1], 1)
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(), StragglerTimeout: 300 * time.Millisecond,
		ExtraOpts: []kgo.Opt{fastRetry, kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second)}})

	type lateOutcome struct {
		id  uuid.UUID
		err error
	}
	lateCh := make(chan lateOutcome, 10)
	reporter := func(evs []event.Envelope) func(int, error) {
		return func(i int, err error) { lateCh <- lateOutcome{evs[i].ID, err} }
	}
	// A healthy partition's record is published in the call, or, when a
	// loaded machine keeps its acknowledgement past the straggler timeout
	// (a CI run: 300 ms), reported unknown and then published late.
	slow := map[uuid.UUID]bool{}
	healthyOutcome := func(call string, e event.Envelope, err error) {
		t.Helper()
		switch {
		case err == nil:
		case errors.Is(err, idemkafka.ErrOutcomeUnknown):
			slow[e.ID] = true
			t.Logf("%s: the healthy partition's record not acknowledged within the straggler timeout (a loaded machine): its outcome comes late", call)
		default:
			t.Fatalf("%s: the healthy partition's record: %v; want published", call, err)
		}
	}
	got := map[uuid.UUID]error{}
	// b1's record is in flight to the partition that does not answer.
	first := []event.Envelope{a1, b1}
	errs := publishErrs(t, pub.PublishLate(t.Context(), first, reporter(first)), 2)
	if !errors.Is(errs[1], idemkafka.ErrOutcomeUnknown) {
		t.Fatalf("first call: b1: %v; want ErrOutcomeUnknown", errs[1])
	}
	healthyOutcome("first call", a1, errs[0])
	// c1's record waits behind it in the client; the call's context ends
	// as it returns, as a relay round's does.
	ctx, cancel := context.WithCancel(t.Context())
	second := []event.Envelope{a2, c1}
	errs = publishErrs(t, pub.PublishLate(ctx, second, reporter(second)), 2)
	cancel()
	if !errors.Is(errs[1], idemkafka.ErrOutcomeUnknown) {
		t.Fatalf("second call: c1: %v; want ErrOutcomeUnknown", errs[1])
	}
	healthyOutcome("second call", a2, errs[0])
	wait := time.After(500 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case o := <-lateCh:
			if !slow[o.id] {
				t.Fatalf("late outcome of %s while its partition does not answer: %v", o.id, o.err)
			}
			got[o.id] = o.err
		case <-wait:
			waiting = false
		}
	}

	// The partition answers: b1 is written, then c1.
	stuck.Store(false)
	want := []event.Envelope{b1, c1}
	if slow[a1.ID] {
		want = append(want, a1) // its record was produced: its outcome comes
	}
	reported := func() bool {
		for _, e := range want {
			if _, ok := got[e.ID]; !ok {
				return false
			}
		}
		return true
	}
	for !reported() {
		select {
		case o := <-lateCh:
			got[o.id] = o.err
		case <-time.After(30 * time.Second):
			t.Fatalf("late outcomes within 30s of the heal: %v; want b1's and c1's (published)", got)
		}
	}
	for _, e := range want {
		if err := got[e.ID]; err != nil {
			t.Errorf("late outcome of %s: %v; want published", e.Key, err)
		}
	}
	if slow[a2.ID] {
		// Failed at once (a1's record waited) or produced: handed over
		// again, as the relay does after its backoff, until published.
		deadline := time.Now().Add(30 * time.Second)
		for err := pub.Publish(t.Context(), []event.Envelope{a2}); err != nil; err = pub.Publish(t.Context(), []event.Envelope{a2}) {
			if time.Now().After(deadline) {
				t.Fatalf("a2 handed over again after the heal: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Handed over again before the relay marked it, c1 is reported
	// published without a new record; the topic holds every event once.
	if err := pub.Publish(t.Context(), []event.Envelope{c1}); err != nil {
		t.Fatalf("c1 handed over again after the heal: %v", err)
	}
	if dups := mustPublishedAtLeastOnce(t, kc.Records(t, topic), []event.Envelope{a1, b1, a2, c1}); dups > 0 {
		t.Errorf("%d duplicates; want none", dups)
	}
}

// stuckTopic is the set-up of the publisher's stuck-partition tests: a
// topic of 2 partitions, partition 0 on a healthy broker and 1 on
// stuckNode, which answers no produce request while stuck is true (it
// starts true); keysIn(p, n) returns n record keys of partition p, and
// ev(key, n) an event of key.
func stuckTopic(t *testing.T) (kc *kafkatest.Cluster, topic string, stuck *atomic.Bool,
	keysIn func(p, n int) []string, ev func(key string, n int) event.Envelope) {
	t.Helper()
	kc = kafkatest.New(t, kfake.NumBrokers(3))
	fake := kc.Fake(t)
	topic = kc.Topic(t, "orders", 2)
	for p, node := range []int32{0, stuckNode} {
		if err := fake.MoveTopicPartition(topic, int32(p), node); err != nil {
			t.Fatal(err)
		}
	}
	stuck = new(atomic.Bool)
	stuck.Store(true)
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		return nil, nil, stuck.Load() && fake.CurrentNode() == stuckNode
	})
	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	keysIn = func(p, n int) []string {
		var ks []string
		for i := 0; len(ks) < n; i++ {
			if k := fmt.Sprintf("order-%d", i); part.Partition(&kgo.Record{Key: []byte(k)}, 2) == p {
				ks = append(ks, k)
			}
		}
		return ks
	}
	ev = func(key string, n int) event.Envelope {
		e, err := event.New("OrderCreated.v1", key, payload{N: n})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	return kc, topic, stuck, keysIn, ev
}

// recordGate is a produce hook that holds the record of event hold back
// from the client (in Produce, before kgo buffers it) until the record of
// event after has its outcome: the widest window between two records of a
// call that kgo takes one Produce at a time.
type recordGate struct {
	hold, after uuid.UUID
	settled     chan struct{} // closed when after's record has its outcome
	once        sync.Once
	outcomes    sync.Map // event ID -> error (nil: written)
}

var (
	_ kgo.HookProduceRecordBuffered   = (*recordGate)(nil)
	_ kgo.HookProduceRecordUnbuffered = (*recordGate)(nil)
)

func (g *recordGate) OnProduceRecordBuffered(r *kgo.Record) {
	if e, err := idemkafka.Envelope(r); err == nil && e.ID == g.hold {
		select {
		case <-g.settled:
		case <-time.After(30 * time.Second):
		}
	}
}

func (g *recordGate) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	e, eerr := idemkafka.Envelope(r)
	if eerr != nil {
		return
	}
	g.outcomes.Store(e.ID, err)
	if e.ID == g.after {
		g.once.Do(func() { close(g.settled) })
	}
}

// A record that a Publish stopped waiting for, buffered behind the ones a
// partition that does not answer holds in flight, does not make kgo fail
// the records another Publish buffered behind it in that partition: kgo
// fails every record buffered in a partition when the first one's context
// has ended as it sends it (the relay ends a round's context as Publish
// returns), and went on with a record of the other call's key produced
// just after, which then reached the topic before the key's earlier event
// (TestRelayStuckPartition/postgres under load: "key order-749: event 7
// first published at 5/629 before event 3"). Here the other call's second
// record reaches the client only once its first has an outcome, the widest
// window kgo's one Produce per record leaves.
func TestPublishStuckPartitionGivenUpRecordKeepsOthersOrder(t *testing.T) {
	t.Parallel()
	kc, topic, stuck, keysIn, ev := stuckTopic(t)
	healthy, stuckKeys := keysIn(0, 1)[0], keysIn(1, 3)
	h1, h2 := ev(healthy, 1), ev(healthy, 2)
	x1, y1, z1, z2 := ev(stuckKeys[0], 1), ev(stuckKeys[1], 1), ev(stuckKeys[2], 1), ev(stuckKeys[2], 2)
	gate := &recordGate{hold: z2.ID, after: z1.ID, settled: make(chan struct{})}
	pub := newPublisher(t, idemkafka.PublisherConfig{Seeds: kc.Seeds, DefaultTopic: topic, Logger: testLogger(), StragglerTimeout: 300 * time.Millisecond,
		ExtraOpts: []kgo.Opt{fastRetry, kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second), kgo.WithHooks(gate)}})

	// x1's record is in flight to the partition that does not answer.
	errs := publishErrs(t, pub.Publish(t.Context(), []event.Envelope{h1, x1}), 2)
	if errs[0] != nil || !errors.Is(errs[1], idemkafka.ErrOutcomeUnknown) {
		t.Fatalf("first call: %v, %v; want published and ErrOutcomeUnknown", errs[0], errs[1])
	}
	// y1's record waits behind it in the client; its call's context ends
	// as the call returns, as a relay round's does.
	ctx, cancel := context.WithCancel(t.Context())
	errs = publishErrs(t, pub.Publish(ctx, []event.Envelope{h2, y1}), 2)
	cancel()
	if errs[0] != nil || !errors.Is(errs[1], idemkafka.ErrOutcomeUnknown) {
		t.Fatalf("second call: %v, %v; want published and ErrOutcomeUnknown", errs[0], errs[1])
	}
	// z1's record waits behind y1's; z2's reaches the client once z1's
	// has its outcome.
	errs = publishErrs(t, pub.Publish(t.Context(), []event.Envelope{z1, z2}), 2)
	for i, err := range errs {
		if !errors.Is(err, idemkafka.ErrOutcomeUnknown) {
			t.Fatalf("third call, event %d: %v; want ErrOutcomeUnknown", i, err)
		}
	}

	// The partition answers: every record left in the client has its
	// outcome within seconds.
	stuck.Store(false)
	waitFor(t, 30*time.Second, "the outcomes of x1, y1, z1 and z2", func() bool {
		for _, e := range []event.Envelope{x1, y1, z1, z2} {
			if _, ok := gate.outcomes.Load(e.ID); !ok {
				return false
			}
		}
		return true
	})
	for _, e := range []event.Envelope{x1, y1, z1, z2} {
		err, _ := gate.outcomes.Load(e.ID)
		t.Logf("record of %s/%d: %v", e.Key, map[uuid.UUID]int{x1.ID: 1, y1.ID: 1, z1.ID: 1, z2.ID: 2}[e.ID], err)
	}
	// As the relay would: every event not known written is handed over
	// again, in order (those written after the calls stopped waiting are
	// reported published without a record).
	if err := pub.Publish(t.Context(), []event.Envelope{x1, y1, z1, z2}); err != nil {
		t.Fatalf("the events handed over again: %v", err)
	}
	mustPublishedAtLeastOnce(t, kc.Records(t, topic), []event.Envelope{h1, x1, h2, y1, z1, z2})
}
