package idemkafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testdb"
)

// dbFaults fails Begin at random, as a flaky database.
type dbFaults struct {
	driver.Driver[*sql.Tx]
	rnd  *rand.Rand
	rate float64
	hits atomic.Int64
}

func (d *dbFaults) Begin(ctx context.Context) (*sql.Tx, error) {
	if d.rate > 0 && d.rnd.Float64() < d.rate {
		d.hits.Add(1)
		return nil, errors.New("connection refused")
	}
	return d.Driver.Begin(ctx)
}

// The per-partition state machine, on random partitions: records that work,
// that fail a few times, that always fail, that are poison, that are not idem
// events, and copies of earlier events; with Handler and with BatchHandler;
// with and without a flaky database (the partition is then "rewound": called
// again on the records not handled). Whatever happens, every record is
// handled once in offset order: applied exactly once, skipped as a
// duplicate, or dead-lettered, as its kind says.
func TestPartitionStateMachine(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "sm", 1)
	dlq := topic + DeadLetterSuffix
	kc.CreateTopic(t, dlq, 1)
	cl := kc.Client(t)
	base := testdb.SQLite(t)
	if _, err := base.DB().Exec(`CREATE TABLE eff (seq INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT NOT NULL, id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	const (
		kOK = iota
		kFlaky
		kAlways
		kPoison
		kGarbage
		kCopy
	)
	run := 0
	for seed := range 30 {
		for _, bulk := range []bool{false, true} {
			for _, rate := range []float64{0, 0.3, -1} {
				run++
				// rate -1: no database faults, but Run's context is
				// cancelled in the middle of the first call (the rest is
				// handled by later calls, as by the next owner).
				stopAfter := -1
				if rate < 0 {
					rate, stopAfter = 0, seed%5
				}
				calls := 0
				ctx, cancel := context.WithCancel(t.Context())
				consumer := fmt.Sprintf("sm-%d", run)
				rnd := rand.New(rand.NewPCG(uint64(seed), 7))
				drv := &dbFaults{Driver: base, rnd: rand.New(rand.NewPCG(uint64(seed), 9)), rate: rate}
				in, err := inbox.New[*sql.Tx](drv, &inbox.Config{Consumer: consumer})
				if err != nil {
					t.Fatal(err)
				}
				n := 1 + rnd.IntN(12)
				kinds := make([]int, n)
				fails := map[uuid.UUID]int{}
				poison := map[uuid.UUID]bool{}
				var recs []*kgo.Record
				var envs []event.Envelope
				for i := range n {
					k := rnd.IntN(8)
					if k > kCopy {
						k = kOK
					}
					if k == kCopy && i == 0 {
						k = kOK
					}
					kinds[i] = k
					var r *kgo.Record
					switch k {
					case kGarbage:
						r = &kgo.Record{Topic: topic, Value: []byte("garbage")}
						envs = append(envs, event.Envelope{})
					case kCopy:
						// A copy of the latest earlier record that is an event.
						j := i - 1
						for j >= 0 && kinds[j] == kGarbage {
							j--
						}
						if j < 0 {
							kinds[i] = kGarbage
							r = &kgo.Record{Topic: topic, Value: []byte("garbage")}
							envs = append(envs, event.Envelope{})
							break
						}
						kinds[i] = kCopy
						r = Record(topic, envs[j])
						envs = append(envs, envs[j])
					default:
						e, err := event.New("T.v1", "k", map[string]int{"i": i})
						if err != nil {
							t.Fatal(err)
						}
						switch k {
						case kFlaky:
							fails[e.ID] = 1 + rnd.IntN(2)
						case kAlways:
							fails[e.ID] = 1 << 30
						case kPoison:
							poison[e.ID] = true
						}
						r = Record(topic, e)
						envs = append(envs, e)
					}
					r.Partition, r.Offset = 0, int64(i)
					recs = append(recs, r)
				}
				try := func(e event.Envelope) error {
					calls++
					if calls == stopAfter {
						cancel()
					}
					if poison[e.ID] {
						return fmt.Errorf("bad: %w", ErrPoison)
					}
					if fails[e.ID] > 0 {
						fails[e.ID]--
						return errors.New("boom")
					}
					return nil
				}
				effect := func(ctx context.Context, tx *sql.Tx, e event.Envelope) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO eff (consumer, id) VALUES (?, ?)`, consumer, e.ID.String())
					return err
				}
				cfg := ConsumerConfig[*sql.Tx]{
					Seeds: kc.Seeds, Group: "g", Topics: []string{topic},
					Retry: Retry{Attempts: 3, Backoff: func(int) time.Duration { return 0 }},
				}
				if bulk {
					cfg.BatchHandler = func(ctx context.Context, tx *sql.Tx, es []event.Envelope) error {
						var errs []error
						for _, e := range es {
							errs = append(errs, try(e))
						}
						if err := errors.Join(errs...); err != nil {
							return err
						}
						for _, e := range es {
							if err := effect(ctx, tx, e); err != nil {
								return err
							}
						}
						return nil
					}
				} else {
					cfg.Handler = func(ctx context.Context, tx *sql.Tx, e event.Envelope) error {
						if err := try(e); err != nil {
							return err
						}
						return effect(ctx, tx, e)
					}
				}
				c := &Consumer[*sql.Tx]{in: in, cfg: cfg.withDefaults()}
				c.cfg.Logger = slog.New(slog.DiscardHandler)

				var total BatchStats
				rest := recs
				for round := 0; len(rest) > 0; round++ {
					if round > 200 {
						t.Fatalf("run %d: no progress after %d rounds, %d records left", run, round, len(rest))
					}
					if round > 0 {
						ctx = t.Context()
					}
					done, st := c.partition(ctx, context.WithoutCancel(ctx), cl, kgo.FetchTopicPartition{Topic: topic, FetchPartition: kgo.FetchPartition{Partition: 0, Records: rest}})
					if done < 0 || done > len(rest) {
						t.Fatalf("run %d: partition returned %d of %d", run, done, len(rest))
					}
					total.Applied += st.Applied
					total.Duplicates += st.Duplicates
					total.DeadLettered += st.DeadLettered
					rest = rest[done:]
				}
				cancel()
				if got := total.Applied + total.Duplicates + total.DeadLettered; got != n {
					t.Errorf("run %d (bulk %v, rate %v, kinds %v): applied %d + duplicates %d + dead %d = %d; want %d records",
						run, bulk, rate, kinds, total.Applied, total.Duplicates, total.DeadLettered, got, n)
				}

				// Expected: the first copy of an ID that is ok or flaky is
				// applied; a later copy is a duplicate; always-failing,
				// poison and garbage records (and their copies) are dead.
				var wantOrder []string
				applied := map[uuid.UUID]bool{}
				wantDead := 0
				for i, k := range kinds {
					id := envs[i].ID
					switch {
					case k == kGarbage:
						wantDead++
					case k == kCopy && applied[id]:
					case poison[id] || fails[id] > 0:
						wantDead++
					default:
						applied[id] = true
						wantOrder = append(wantOrder, id.String())
					}
				}
				rows, err := base.DB().Query(`SELECT id FROM eff WHERE consumer = ? ORDER BY seq`, consumer)
				if err != nil {
					t.Fatal(err)
				}
				var gotOrder []string
				for rows.Next() {
					var s string
					if err := rows.Scan(&s); err != nil {
						t.Fatal(err)
					}
					gotOrder = append(gotOrder, s)
				}
				_ = rows.Close()
				if fmt.Sprint(gotOrder) != fmt.Sprint(wantOrder) {
					t.Errorf("run %d (bulk %v, rate %v, kinds %v): effects %v; want %v", run, bulk, rate, kinds, gotOrder, wantOrder)
				}
				if total.DeadLettered != wantDead {
					t.Errorf("run %d (bulk %v, rate %v, kinds %v): %d dead-lettered; want %d", run, bulk, rate, kinds, total.DeadLettered, wantDead)
				}
			}
		}
	}
}

// BatchStats.Duration is each partition's own time (plus the shared offset
// commit): a slow partition of the same poll is not counted in a fast one.
// Partition 0, applied first, counted partition 1's time before.
func TestBatchDurationPerPartition(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	topic := kc.Topic(t, "dur", 2)
	cl := kc.Client(t)
	db := testdb.SQLite(t)
	in, err := inbox.New[*sql.Tx](db, &inbox.Config{Consumer: "dur"})
	if err != nil {
		t.Fatal(err)
	}
	const slow = 500 * time.Millisecond
	var stats []BatchStats
	cfg := ConsumerConfig[*sql.Tx]{
		Seeds: kc.Seeds, Group: "g", Topics: []string{topic},
		Handler: func(_ context.Context, _ *sql.Tx, e event.Envelope) error {
			if e.Key == "slow" {
				time.Sleep(slow)
			}
			return nil
		},
		OnBatch: func(_ context.Context, s BatchStats) { stats = append(stats, s) },
		Logger:  slog.New(slog.DiscardHandler),
	}
	c := &Consumer[*sql.Tx]{in: in, cfg: cfg.withDefaults()}
	record := func(key string, partition int32) *kgo.Record {
		e, err := event.New("T.v1", key, map[string]int{})
		if err != nil {
			t.Fatal(err)
		}
		r := Record(topic, e)
		r.Partition = partition
		return r
	}
	fs := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: []kgo.FetchPartition{
		{Partition: 0, Records: []*kgo.Record{record("fast", 0)}},
		{Partition: 1, Records: []*kgo.Record{record("slow", 1)}},
	}}}}}
	c.cycle(t.Context(), cl, fs)
	if len(stats) != 2 {
		t.Fatalf("%d batches reported; want 2", len(stats))
	}
	for _, s := range stats {
		if s.Applied != 1 {
			t.Errorf("partition %d: %d applied; want 1", s.Partition, s.Applied)
		}
		switch {
		case s.Partition == 0 && s.Duration >= slow/2:
			t.Errorf("partition 0 (fast): Duration %s; want well under partition 1's %s", s.Duration, slow)
		case s.Partition == 1 && s.Duration < slow:
			t.Errorf("partition 1 (slow): Duration %s; want at least %s", s.Duration, slow)
		}
	}
}
