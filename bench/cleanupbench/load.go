package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/driver"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/driver/pgdriver"
)

// phase is what the insert load did during the slices of one kind.
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
	fmt.Printf("%-28s %9s %9s %9s %9s %9s %9s %6s\n", "insert load", "duration", "tx/s", "rows/s", "p50", "p99", "max", "failed")
}

func (p phase) print(name string) {
	fmt.Printf("%-28s %9s %9.0f %9.0f %9s %9s %9s %6d\n", name, p.wall.Round(10*time.Millisecond), p.txPerSec(),
		float64(p.rows)/p.wall.Seconds(), p.quantile(0.5).Round(10*time.Microsecond), p.quantile(0.99).Round(10*time.Microsecond),
		p.quantile(1).Round(10*time.Microsecond), p.failed)
}

// Kinds of slices the load is measured in.
const (
	without = 0 // no cleanup running
	with    = 1 // the cleaner sweeping
)

// clock tells the writers which kind of slice is running and adds up the
// wall time of each kind.
type clock struct {
	kind  atomic.Int32
	mu    sync.Mutex
	since time.Time
	walls [2]time.Duration
}

// set switches to kind k, crediting the time since the last switch.
func (c *clock) set(k int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if !c.since.IsZero() {
		c.walls[c.kind.Load()] += now.Sub(c.since)
	}
	c.since = now
	c.kind.Store(k)
}

// drive runs the insert load until work returns, and reports it per kind
// of slice (work switches kinds with clk.set).
func drive(ctx context.Context, o options, drv *pgdriver.Driver, work func(ctx context.Context, clk *clock) error) ([2]phase, error) {
	loadCtx, stop := context.WithCancel(ctx)
	clk := &clock{}
	clk.set(without)
	var wg sync.WaitGroup
	results := make([][2]phase, o.writers)
	errs := make([]error, o.writers)
	for w := range o.writers {
		wg.Go(func() { results[w], errs[w] = writer(loadCtx, o, drv, clk) })
	}
	werr := work(ctx, clk)
	clk.set(without)
	stop()
	wg.Wait()
	var out [2]phase
	for k := range out {
		out[k].wall = clk.walls[k]
		for _, r := range results {
			out[k].latencies = append(out[k].latencies, r[k].latencies...)
			out[k].rows += r[k].rows
			out[k].failed += r[k].failed
		}
		slices.Sort(out[k].latencies)
	}
	return out, errors.Join(werr, errors.Join(errs...))
}

// writer inserts fresh event ids in small transactions until ctx is done.
// A failed insert is counted, and ends the run with its error.
func writer(ctx context.Context, o options, drv *pgdriver.Driver, clk *clock) ([2]phase, error) {
	var p [2]phase
	ids := make([]uuid.UUID, o.ids)
	for ctx.Err() == nil {
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7())
		}
		start := time.Now()
		err := insertTx(ctx, drv, ids)
		if ctx.Err() != nil {
			return p, nil //nolint:nilerr // the run ended mid-transaction: not a failed insert
		}
		if err != nil {
			p[clk.kind.Load()].failed++
			return p, fmt.Errorf("insert: %w", err)
		}
		k := clk.kind.Load()
		p[k].latencies = append(p[k].latencies, time.Since(start))
		p[k].rows += len(ids)
	}
	return p, nil
}

func insertTx(ctx context.Context, drv *pgdriver.Driver, ids []uuid.UUID) error {
	tx, err := drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = drv.Rollback(context.Background(), tx) }()
	got, err := drv.UnwrapExecutor(tx).InboxInsert(ctx, &driver.InboxInsertParams{Consumer: "bench-live", IDs: ids, Now: time.Now()})
	if err != nil {
		return err
	}
	if len(got) != len(ids) {
		return fmt.Errorf("%d of %d ids new", len(got), len(ids))
	}
	return drv.Commit(ctx, tx)
}
