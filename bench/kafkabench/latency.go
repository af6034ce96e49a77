package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

const (
	// latencyFetchWait is the live consumer's FetchMaxWait: kfake answers a
	// fetch as soon as a record arrives, and this bounds what an empty
	// fetch can add to a record that arrives just after it was answered.
	latencyFetchWait = 10 * time.Millisecond
	// latencyDrain bounds the wait, after the last enqueue, for every event
	// to be published and consumed (the relay's poll interval is 1 s, so an
	// event whose wake-up was lost is still published well within it).
	latencyDrain = 15 * time.Second
	// latencyMinRate is the share of -latency-rate the writers must reach
	// for the check to pass.
	latencyMinRate = 0.95
)

// latencyPayload is the body of an event of the latency scenario: its key
// and sequence within the key (as relayPayload), and its index in the
// bench's per-event time tables.
type latencyPayload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	I   int    `json:"i"`
}

// latencyTimes are the per-event times of the latency scenario, as offsets
// from the run's base time (monotonic clock; 0 is "not yet"). Slot i
// belongs to event i. commit, begin and measured are written by the event's
// writer; published and pubCount under mu by OnPublished; consumed and
// consCount by the consumer goroutine. They are read once all of those
// have stopped.
type latencyTimes struct {
	begin     []time.Duration // before BEGIN
	commit    []time.Duration // right after COMMIT returned
	measured  []bool          // enqueued after the warm-up
	published []time.Duration // first OnPublished
	consumed  []time.Duration // first seen by the consumer
	pubCount  []int
	consCount []int
}

// runLatency measures commit-to-publish latency at a steady load: writers
// enqueue one event per transaction at -latency-rate while -relays relays,
// woken by LISTEN/NOTIFY, publish them to kfake and a kgo consumer reads
// them back.
func (b *bench) runLatency(ctx context.Context) error {
	o := b.o
	if _, err := b.admin.Exec(ctx, "TRUNCATE "+b.outboxTables()); err != nil {
		return fmt.Errorf("truncate outbox: %w", err)
	}
	topic := fmt.Sprintf("kafkabench-%s-latency", b.runID)
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), topic))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer kf.Close()
	seeds := kf.ListenAddrs()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pub, err := newPublisher(ctx, seeds, topic, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	rd, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(latencyFetchWait))
	if err != nil {
		return err
	}
	defer rd.Close()
	if err := rd.Ping(ctx); err != nil {
		return fmt.Errorf("kfake ping: %w", err)
	}

	// Per-event slots: writer w owns [w*per, (w+1)*per).
	writers := o.latencyWriters
	interval := time.Duration(float64(writers) * float64(time.Second) / o.latencyRate)
	per := int((o.latencyWarmup+o.latencyDuration)/interval) + 2
	total := writers * per
	ts := &latencyTimes{
		begin: make([]time.Duration, total), commit: make([]time.Duration, total), measured: make([]bool, total),
		published: make([]time.Duration, total), consumed: make([]time.Duration, total),
		pubCount: make([]int, total), consCount: make([]int, total),
	}

	wpool, wdrv, err := b.open(ctx, writers)
	if err != nil {
		return err
	}
	defer wpool.Close()
	rpool, rdrv, err := b.open(ctx, o.relays+1)
	if err != nil {
		return err
	}
	defer rpool.Close()

	base := time.Now()
	var (
		mu           sync.Mutex
		pubDistinct  atomic.Int64
		pubUnknown   atomic.Int64
		batches      atomic.Int64
		consDistinct atomic.Int64
	)
	index := func(payload []byte) (int, bool) {
		var p latencyPayload
		if json.Unmarshal(payload, &p) != nil || p.I < 0 || p.I >= total {
			return 0, false
		}
		return p.I, true
	}
	var drv driver.Driver[pgx.Tx] = rdrv
	rcfg := &outbox.RelayConfig{
		Logger: logger,
		OnPublished: func(evs []event.Envelope) {
			at := time.Since(base)
			batches.Add(1)
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				i, ok := index(e.Payload)
				if !ok {
					pubUnknown.Add(1)
					continue
				}
				if ts.pubCount[i]++; ts.pubCount[i] == 1 {
					ts.published[i] = at
					pubDistinct.Add(1)
				}
			}
		},
	}
	relays := make([]*outbox.Relay[pgx.Tx], o.relays)
	for i := range relays {
		if relays[i], err = outbox.NewRelay(drv, pub, rcfg); err != nil {
			return err
		}
	}

	// The consumer: the receive time of a record is when its fetch returned.
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	rctx, stopRelays := context.WithCancel(ctx)
	var (
		cwg, rwg, wwg            sync.WaitGroup
		consErr                  error
		consRecords, consUnknown int
		consDisorder             int
		lastSeq                  = map[string]int{}
		werrs                    = make([]error, writers)
		enqueued                 = make([]int, writers)
		late                     = make([]int, writers)
		warmEnd                  = base.Add(o.latencyWarmup)
		end                      = warmEnd.Add(o.latencyDuration)
	)
	defer stopRelays()
	cwg.Go(func() {
		for {
			fs := rd.PollFetches(cctx)
			if cctx.Err() != nil {
				return
			}
			at := time.Since(base)
			fs.EachError(func(_ string, p int32, err error) {
				consErr = errors.Join(consErr, fmt.Errorf("read %s/%d: %w", topic, p, err))
			})
			fs.EachRecord(func(r *kgo.Record) {
				consRecords++
				var p latencyPayload
				if json.Unmarshal(r.Value, &p) != nil || p.I < 0 || p.I >= total || p.Key != string(r.Key) {
					consUnknown++
					return
				}
				if ts.consCount[p.I]++; ts.consCount[p.I] > 1 {
					return
				}
				ts.consumed[p.I] = at
				consDistinct.Add(1)
				if p.Seq != lastSeq[p.Key]+1 {
					consDisorder++
				}
				lastSeq[p.Key] = max(lastSeq[p.Key], p.Seq)
			})
			if consErr != nil {
				return
			}
		}
	})
	for _, r := range relays {
		rwg.Go(func() { _ = r.Run(rctx) })
	}

	// The writers: writer w owns the keys k with k % writers == w, so a
	// key's events commit one after the other, in sequence order. Writer w
	// owes its n-th event at its start + n*interval; its ticker is the
	// pacing, and when a slow commit made it miss ticks it catches up at
	// once (counted as late) rather than dropping them. The writers' starts
	// are staggered so that the commits are spread evenly.
	for w := range writers {
		wwg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			var keys []int
			for k := w; k < o.relayKeys; k += writers {
				keys = append(keys, k)
			}
			if len(keys) == 0 {
				return
			}
			seq := map[int]int{}
			enqueue := func(i int, t time.Time) error {
				k := keys[rng.IntN(len(keys))]
				seq[k]++
				key := fmt.Sprintf("key-%d", k)
				ev, err := event.New("BenchEvent.v1", key, latencyPayload{Key: key, Seq: seq[k], I: i})
				if err != nil {
					return err
				}
				if err := pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error { return outbox.EnqueueTx(ctx, wdrv, tx, ev) }); err != nil {
					return fmt.Errorf("enqueue: %w", err)
				}
				ts.commit[i] = time.Since(base)
				ts.begin[i] = t.Sub(base)
				ts.measured[i] = !t.Before(warmEnd)
				return nil
			}
			time.Sleep(time.Duration(w) * interval / time.Duration(writers))
			start := time.Now()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 0; n < per; {
				select {
				case <-ctx.Done():
					werrs[w] = ctx.Err()
					return
				case <-tick.C:
				}
				for due := min(int(time.Since(start)/interval), per); n < due; n++ {
					t := time.Now()
					if !t.Before(end) {
						return
					}
					if t.Sub(start) > time.Duration(n+2)*interval && !t.Before(warmEnd) {
						late[w]++
					}
					if werrs[w] = enqueue(w*per+n, t); werrs[w] != nil {
						return
					}
					enqueued[w] = n + 1
				}
			}
		})
	}

	// Mark the window (counters and relay batches), then wait for the
	// writers and for every event to be published and consumed.
	sleepUntil := func(t time.Time) {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(t)):
		}
	}
	sleepUntil(warmEnd)
	batchesWarm := batches.Load()
	countersWarm, errWarm := b.counters(ctx)
	sleepUntil(end)
	batchesEnd := batches.Load()
	countersEnd, errEnd := b.counters(ctx)
	wwg.Wait()
	var n int64
	for _, e := range enqueued {
		n += int64(e)
	}
	deadline := time.Now().Add(latencyDrain)
	for ctx.Err() == nil && time.Now().Before(deadline) && (pubDistinct.Load() < n || consDistinct.Load() < n) {
		time.Sleep(5 * time.Millisecond)
	}
	// A little longer, so that a duplicate would be seen.
	sleepUntil(time.Now().Add(200 * time.Millisecond))
	stopRelays()
	rwg.Wait()
	stopConsumer()
	cwg.Wait()
	if err := errors.Join(append(werrs, ctx.Err(), consErr, errWarm, errEnd)...); err != nil {
		return err
	}

	var unpublished int
	if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.schema, "outbox_pending"}.Sanitize()).Scan(&unpublished); err != nil {
		return err
	}

	// Latencies of the events enqueued after the warm-up.
	var pubLat, consLat, txDur []time.Duration
	var measured, pubTwice, consDups, pubMissing, consMissing int
	for w := range writers {
		for i := w * per; i < w*per+enqueued[w]; i++ {
			pubTwice += max(ts.pubCount[i]-1, 0)
			consDups += max(ts.consCount[i]-1, 0)
			if ts.pubCount[i] == 0 {
				pubMissing++
			}
			if ts.consCount[i] == 0 {
				consMissing++
			}
			if !ts.measured[i] {
				continue
			}
			measured++
			txDur = append(txDur, ts.commit[i]-ts.begin[i])
			if ts.pubCount[i] > 0 {
				pubLat = append(pubLat, ts.published[i]-ts.commit[i])
			}
			if ts.consCount[i] > 0 {
				consLat = append(consLat, ts.consumed[i]-ts.commit[i])
			}
		}
	}
	achieved := float64(measured) / o.latencyDuration.Seconds()
	c := countersEnd.sub(countersWarm)
	win := o.latencyDuration.Seconds()
	nb := batchesEnd - batchesWarm

	fmt.Printf("latency: outbox.Relay + idemkafka.Publisher -> kfake (1 broker, in process, TCP on 127.0.0.1), topic of %d partitions; a kgo consumer reads it\n", o.partitions)
	fmt.Printf("         RelayConfig: defaults (BatchSize 500, PollInterval 1s; Wake nil: each relay LISTENs on pgdriver's notifier), %d relay(s); consumer FetchMaxWait %s\n",
		o.relays, latencyFetchWait)
	fmt.Printf("         load: %d writers, one transaction per event (outbox.EnqueueTx) over %d keys, target %.0f events/s for %s after a %s warm-up\n",
		writers, o.relayKeys, o.latencyRate, o.latencyDuration, o.latencyWarmup)
	var nLate int
	for _, l := range late {
		nLate += l
	}
	fmt.Printf("         achieved %.0f events/s (%d events in the window, %d in all; %d sent over a tick late, the writer catching up)\n",
		achieved, measured, n, nLate)
	fmt.Printf("         enqueue tx BEGIN..COMMIT:          %s\n", pctLine(txDur))
	fmt.Printf("         in the window: %.0f relay batches/s (%.1f events/batch), %.0f fsync/s, %.0f commits/s\n",
		float64(nb)/win, float64(measured)/max(float64(nb), 1), float64(c.walSync)/win, float64(c.commits)/win)
	fmt.Printf("         commit -> published (relay acked): %s\n", pctLine(pubLat))
	fmt.Printf("         commit -> consumed:                %s\n", pctLine(consLat))
	fmt.Printf("         events: %d enqueued; relay: %d not published, %d published twice, %d unknown; consumer: %d records, %d lost, %d duplicated, %d unknown, per-key order violations %d; outbox rows left unpublished %d\n",
		n, pubMissing, pubTwice, pubUnknown.Load(), consRecords, consMissing, consDups, consUnknown, consDisorder, unpublished)
	ok := pubMissing == 0 && consMissing == 0 && pubTwice == 0 && consDups == 0 && pubUnknown.Load() == 0 &&
		consUnknown == 0 && consDisorder == 0 && unpublished == 0
	rateOK := achieved >= latencyMinRate*o.latencyRate
	note := ""
	if !rateOK {
		note = fmt.Sprintf(" (the writers fell behind: %.0f < %.0f%% of %.0f events/s)", achieved, 100*latencyMinRate, o.latencyRate)
	}
	fmt.Printf("latency check: %s%s\n", okStr(ok && rateOK), note)
	if !ok {
		return errors.New("latency: events lost, duplicated or out of order (see above)")
	}
	if !rateOK {
		return errors.New("latency: the writers did not reach -latency-rate")
	}
	return nil
}

// pctLine formats p50, p90, p99 and max of ds (which it sorts).
func pctLine(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no events"
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration {
		// Nearest rank.
		i := int(p*float64(len(ds))+0.999999) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }
	return fmt.Sprintf("p50 %7s  p90 %7s  p99 %7s  max %7s  (n=%d)", ms(at(0.50)), ms(at(0.90)), ms(at(0.99)), ms(ds[len(ds)-1]), len(ds))
}
