package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/outbox"
)

// relayPayload is the body of a relayed event: its key and its position in
// the key's sequence (1, 2, ...), which the reader checks.
type relayPayload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// runRelay fills the outbox with -relay-n events over -relay-keys keys,
// times -relays relays publishing them to a fresh kfake topic with batch
// size bs, and reads the topic back to check count and per-key order.
func (b *bench) runRelay(ctx context.Context, bs int) error {
	o := b.o
	cfgBatch := bs
	if bs == 0 {
		bs = 500 // what outbox.RelayConfig defaults to; printed as such below
	}
	if _, err := b.admin.Exec(ctx, "TRUNCATE "+b.outboxTables()); err != nil {
		return fmt.Errorf("truncate outbox: %w", err)
	}
	topic := fmt.Sprintf("kafkabench-%s-%d", b.runID, bs)
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), topic))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer kf.Close()
	seeds := kf.ListenAddrs()

	// Fill the outbox (untimed for the relay, but reported).
	fillStart := time.Now()
	if err := b.fillOutbox(ctx, o.relayN); err != nil {
		return err
	}
	fill := time.Since(fillStart)
	if _, err := b.admin.Exec(ctx, "VACUUM ANALYZE "+b.outboxTables()); err != nil {
		return fmt.Errorf("vacuum outbox: %w", err)
	}
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pub, err := newPublisher(ctx, seeds, topic, logger)
	if err != nil {
		return err
	}
	defer pub.Close()

	conc := o.relayConc
	if conc == 0 {
		conc = 2 // outbox.RelayConfig's default
	}
	pool, pgd, err := b.open(ctx, o.relays*conc+1) // a connection per batch in flight, and one for the lag
	if err != nil {
		return err
	}
	if o.relayDelete {
		if pgd, err = pgdriver.New(pool, &pgdriver.Config{OutboxDeletePublished: true}); err != nil {
			pool.Close()
			return err
		}
	}
	var drv driver.Driver[pgx.Tx] = pgd
	label := "relay"
	var published atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	rcfg := &outbox.RelayConfig{
		BatchSize:   cfgBatch,
		Concurrency: o.relayConc,
		Logger:      logger,
		OnPublished: func(evs []event.Envelope) {
			if published.Add(int64(len(evs))) >= int64(o.relayN) {
				once.Do(func() { close(done) })
			}
		},
	}
	relays := make([]*outbox.Relay[pgx.Tx], o.relays)
	for i := range relays {
		if relays[i], err = outbox.NewRelay(drv, pub, rcfg); err != nil {
			pool.Close()
			return err
		}
	}
	c0, err := b.counters(ctx)
	if err != nil {
		pool.Close()
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range relays {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	var timedOut bool
	select {
	case <-done:
	case <-time.After(o.relayTimeout):
		timedOut = true
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if err := b.closePool(ctx, pool); err != nil {
		return err
	}
	c1, err := b.counters(ctx)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c := c1.sub(c0)
	n := published.Load()
	eps := float64(n) / elapsed.Seconds()

	var unpublished int
	if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.schema, "outbox_pending"}.Sanitize()).Scan(&unpublished); err != nil {
		return err
	}
	chk, err := readBack(ctx, seeds, topic)
	if err != nil {
		return err
	}

	def := ""
	if cfgBatch == 0 {
		def = " (library default)"
	}
	fmt.Printf("%s: outbox.Relay + idemkafka.Publisher -> kfake (1 broker, in process, TCP on 127.0.0.1), topic of %d partitions\n", label, o.partitions)
	concStr := fmt.Sprint(o.relayConc)
	if o.relayConc == 0 {
		concStr = "2 (library default)"
	}
	mode := "rows marked published (kept for audits and redrive)"
	if o.relayDelete {
		mode = "rows deleted once published (pgdriver.Config.OutboxDeletePublished)"
	}
	fmt.Printf("       RelayConfig{BatchSize: %d%s, Concurrency: %s, PollInterval/Backoff/PublishTimeout: defaults, Wake: none (the backlog is there at start)}, %d relay(s)\n",
		bs, def, concStr, o.relays)
	fmt.Printf("       outbox: %s\n", mode)
	fmt.Printf("       producer: idempotent, acks=all (idemkafka defaults; ProduceSync unlingers its partitions)\n")
	fmt.Printf("       outbox filled with %d events over %d keys by %d writers in transactions of %d (outbox.EnqueueTx): %s = %.0f events/s\n",
		o.relayN, o.relayKeys, o.enqueueWriter, o.enqueueBatch, fill.Round(time.Millisecond), float64(o.relayN)/fill.Seconds())
	fmt.Printf("       published %d events in %s = %.0f events/s; %.0f fsync/s (%.0f events/fsync), %.0f commits/s, WAL %.0f B/event\n",
		n, elapsed.Round(time.Millisecond), eps, float64(c.walSync)/elapsed.Seconds(), float64(n)/max(float64(c.walSync), 1),
		float64(c.commits)/elapsed.Seconds(), c.walBytes/max(float64(n), 1))
	fmt.Printf("       outbox rows left unpublished: %d\n", unpublished)
	fmt.Printf("       read back: %d records, %d distinct events, %d duplicates, %d missing, %d unknown; per-key order violations: %d (keys %d)\n",
		chk.records, chk.distinct, chk.dups, o.relayN-chk.distinct, chk.unknown, chk.disorder, chk.keys)
	ok := !timedOut && n >= int64(o.relayN) && unpublished == 0 && chk.distinct == o.relayN && chk.disorder == 0 && chk.unknown == 0
	target := 30000.0
	if o.relayKeys == 1000 {
		target = 50000
	}
	verdict := "MISS"
	if eps >= target {
		verdict = "PASS"
	}
	fmt.Printf("target %s >= %.0f events/s with per-key order kept: %.0f  %s; order and count check: %s\n", label, target, eps, verdict, okStr(ok))
	if !ok {
		return errors.New("relay: the published log failed its checks (see above)")
	}
	return nil
}

func okStr(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAILED"
}

// fillOutbox enqueues n events over -relay-keys keys. Each writer owns the
// keys k with k % writers == its index and enqueues their events in
// sequence order, so the outbox order of a key is its sequence order.
func (b *bench) fillOutbox(ctx context.Context, n int) error {
	o := b.o
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 11))
	seq := make([]int, o.relayKeys)
	per := make([][]relayPayload, o.enqueueWriter)
	for range n {
		k := rng.IntN(o.relayKeys)
		seq[k]++
		w := k % o.enqueueWriter
		per[w] = append(per[w], relayPayload{Key: fmt.Sprintf("key-%d", k), Seq: seq[k]})
	}
	pool, drv, err := b.open(ctx, o.enqueueWriter)
	if err != nil {
		return err
	}
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make([]error, o.enqueueWriter)
	for w := range per {
		wg.Go(func() {
			ps := per[w]
			for lo := 0; lo < len(ps) && errs[w] == nil; lo += o.enqueueBatch {
				chunk := ps[lo:min(lo+o.enqueueBatch, len(ps))]
				evs := make([]event.Envelope, len(chunk))
				for i, p := range chunk {
					if evs[i], errs[w] = event.New("BenchEvent.v1", p.Key, p); errs[w] != nil {
						return
					}
				}
				errs[w] = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.EnqueueTx(ctx, drv, tx, evs...) })
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fill outbox: %w", err)
	}
	return nil
}

// logCheck is what reading the topic back found.
type logCheck struct {
	records, distinct, dups, unknown, disorder, keys int
}

// readBack reads every record of topic and checks that each event is there
// and that, per key, the first copies of the events come in sequence order
// with no gap (1, 2, 3, ...).
func readBack(ctx context.Context, seeds []string, topic string) (logCheck, error) {
	var chk logCheck
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return chk, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return chk, fmt.Errorf("end offsets: %w", err)
	}
	want := map[int32]int64{}
	parts := map[string]map[int32]kgo.Offset{topic: {}}
	var lerr error
	ends.Each(func(lo kadm.ListedOffset) {
		if lo.Err != nil {
			lerr = lo.Err
		}
		parts[topic][lo.Partition] = kgo.NewOffset().AtStart()
		if lo.Offset > 0 {
			want[lo.Partition] = lo.Offset
		}
	})
	if lerr != nil {
		return chk, fmt.Errorf("end offsets: %w", lerr)
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumePartitions(parts), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return chk, err
	}
	defer rd.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	seen := map[uuid.UUID]bool{}
	last := map[string]int{}
	for len(want) > 0 {
		fs := rd.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return chk, fmt.Errorf("read %s: %w (still waiting for %v)", topic, err, want)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = fmt.Errorf("read %s/%d: %w", topic, p, err) })
		if ferr != nil {
			return chk, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			chk.records++
			e, err := idemkafka.Envelope(r)
			var p relayPayload
			if err == nil {
				err = json.Unmarshal(e.Payload, &p)
			}
			if err != nil || p.Key != e.Key {
				chk.unknown++
				return
			}
			if seen[e.ID] {
				chk.dups++
				return
			}
			seen[e.ID] = true
			if p.Seq != last[p.Key]+1 {
				chk.disorder++
			}
			last[p.Key] = max(last[p.Key], p.Seq)
		})
	}
	chk.distinct = len(seen)
	chk.keys = len(last)
	return chk, nil
}

// newPublisher returns the relay's publisher to the kfake topic, connected.
func newPublisher(ctx context.Context, seeds []string, topic string, logger *slog.Logger) (*idemkafka.Publisher, error) {
	pub, err := idemkafka.NewPublisher(&idemkafka.PublisherConfig{Seeds: seeds, DefaultTopic: topic, Logger: logger})
	if err != nil {
		return nil, err
	}
	if err := pub.Client().Ping(ctx); err != nil {
		pub.Close()
		return nil, fmt.Errorf("kfake ping: %w", err)
	}
	return pub, nil
}

// outboxTables lists the bench schema's outbox tables (the events, the
// pending rows and the publication log) for TRUNCATE and VACUUM.
func (b *bench) outboxTables() string {
	return pgx.Identifier{b.schema, "outbox"}.Sanitize() + ", " +
		pgx.Identifier{b.schema, "outbox_pending"}.Sanitize() + ", " +
		pgx.Identifier{b.schema, "outbox_published"}.Sanitize()
}
