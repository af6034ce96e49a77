package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// runEnqueue measures what the outbox's pg_notify costs the enqueuing
// side: -enqueue-writers goroutines (connections), each committing
// transactions of one outbox.EnqueueTx of one event, through a driver that
// notifies (the default) and one with pgdriver.Config.NoOutboxNotify, in
// turns of -enqueue-slice in random order over -rounds rounds. PostgreSQL
// commits notifying transactions one at a time, server-wide, so their
// rate is bounded by one WAL flush per commit whatever the writers.
func (b *bench) runEnqueue(ctx context.Context) error {
	writers := b.o.enqueueWriter
	pool, notifying, err := b.open(ctx, writers)
	if err != nil {
		return err
	}
	defer func() { _ = b.closePool(context.Background(), pool) }()
	silent, err := pgdriver.New(pool, &pgdriver.Config{Schema: b.schema, NoOutboxNotify: true})
	if err != nil {
		return err
	}
	fmt.Printf("enqueue: %d writers, one event per transaction (outbox.EnqueueTx), %s turns, %d rounds\n",
		writers, b.o.enqueueSlice, b.o.rounds)
	drivers := []struct {
		name string
		drv  *pgdriver.Driver
	}{{"notify (default)", notifying}, {"NoOutboxNotify", silent}}
	rates := make([][]float64, len(drivers))
	var seq atomic.Int64
	for round := range b.o.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			n, took, err := enqueueFor(ctx, drivers[i].drv, writers, b.o.enqueueSlice, &seq)
			if err != nil {
				return fmt.Errorf("enqueue %s: %w", drivers[i].name, err)
			}
			rates[i] = append(rates[i], float64(n)/took.Seconds())
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for i, d := range drivers {
		fmt.Printf("  %-18s %8.0f commits/s (median of %v)\n", d.name, med(rates[i]), roundAll(rates[i]))
	}
	fmt.Printf("  NoOutboxNotify / notify: %.2f\n", med(rates[1])/med(rates[0]))
	return nil
}

// enqueueFor runs writers goroutines committing one event per transaction
// on drv for d, and returns the commits and the time they took.
func enqueueFor(ctx context.Context, drv *pgdriver.Driver, writers int, d time.Duration, seq *atomic.Int64) (int64, time.Duration, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	end := start.Add(d)
	for w := range writers {
		wg.Go(func() {
			for time.Now().Before(end) {
				ev, err := event.New("Enqueued.v1", fmt.Sprintf("w%d-%d", w, seq.Add(1)%64), map[string]int64{"seq": seq.Load()})
				if err != nil {
					errs <- err
					return
				}
				tx, err := drv.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if err := outbox.EnqueueTx(ctx, drv, tx, ev); err != nil {
					_ = drv.Rollback(ctx, tx)
					errs <- err
					return
				}
				if err := drv.Commit(ctx, tx); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		return 0, 0, err
	}
	return n.Load(), took, nil
}

func roundAll(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x + 0.5)
	}
	return out
}
