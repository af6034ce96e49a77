package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver/pgdriver"
)

// phase is what the insert load did while one phase ran.
type phase struct {
	wall      time.Duration
	latencies []time.Duration // one per committed transaction
	rows      int
	failed    int
}

func (p phase) txPerSec() float64 { return float64(len(p.latencies)) / p.wall.Seconds() }

func (p phase) quantile(q float64) time.Duration {
	if len(p.latencies) == 0 {
		return 0
	}
	return p.latencies[min(len(p.latencies)-1, int(q*float64(len(p.latencies))))]
}

func printHeader() {
	fmt.Printf("%-26s %9s %9s %9s %9s %9s %9s %6s\n", "phase", "duration", "tx/s", "rows/s", "p50", "p99", "max", "failed")
}

func (p phase) print(name string) {
	fmt.Printf("%-26s %9s %9.0f %9.0f %9s %9s %9s %6d\n", name, p.wall.Round(10*time.Millisecond), p.txPerSec(),
		float64(p.rows)/p.wall.Seconds(), p.quantile(0.5).Round(10*time.Microsecond), p.quantile(0.99).Round(10*time.Microsecond),
		p.quantile(1).Round(10*time.Microsecond), p.failed)
}

// drive runs the insert load until work returns, and reports it.
func drive(ctx context.Context, o options, drv *pgdriver.Driver, work func(ctx context.Context) error) (phase, error) {
	loadCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	results := make([]phase, o.writers)
	errs := make([]error, o.writers)
	start := time.Now()
	for w := range o.writers {
		wg.Go(func() { results[w], errs[w] = writer(loadCtx, o, drv) })
	}
	werr := work(ctx)
	stop()
	wg.Wait()
	out := phase{wall: time.Since(start)}
	for _, r := range results {
		out.latencies = append(out.latencies, r.latencies...)
		out.rows += r.rows
		out.failed += r.failed
	}
	slices.Sort(out.latencies)
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	return out, werr
}

// writer inserts fresh event ids in small transactions until ctx is done.
// A failed insert is counted, and ends the run with its error.
func writer(ctx context.Context, o options, drv *pgdriver.Driver) (phase, error) {
	var p phase
	ids := make([]uuid.UUID, o.ids)
	for ctx.Err() == nil {
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7())
		}
		start := time.Now()
		err := insertTx(ctx, drv, ids)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			p.failed++
			return p, fmt.Errorf("insert: %w", err)
		}
		p.latencies = append(p.latencies, time.Since(start))
		p.rows += len(ids)
	}
	return p, nil
}

func insertTx(ctx context.Context, drv *pgdriver.Driver, ids []uuid.UUID) error {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = drv.Rollback(context.Background(), tx) }()
	got, err := drv.UnwrapExecutor(tx).InboxInsert(ctx, "bench-live", ids, time.Now())
	if err != nil {
		return err
	}
	if len(got) != len(ids) {
		return fmt.Errorf("%d of %d ids new", len(got), len(ids))
	}
	return drv.Commit(ctx, tx)
}
