package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
)

// partitionMode converts processed_event, fills one day's partition with
// o.rows rows and times dropping it while the insert load runs.
func partitionMode(ctx context.Context, o options, drv *pgdriver.Driver) error {
	now := time.Now()
	start := time.Now()
	if err := drv.EnableInboxPartitioning(ctx, &pgdriver.PartitionOptions{Now: now, Behind: 5, Ahead: 3}); err != nil {
		return err
	}
	fmt.Printf("\npartition mode: EnableInboxPartitioning (copying the %s) in %s\n",
		"rows inserted above", time.Since(start).Round(time.Millisecond))

	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).AddDate(0, 0, -5)
	start = time.Now()
	n, err := drv.Pool().CopyFrom(ctx, pgx.Identifier{"processed_event"}, []string{"event_id", "consumer_name", "processed_at"},
		&dayRows{day: day, n: o.rows})
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if _, err := drv.Pool().Exec(ctx, `VACUUM ANALYZE processed_event`); err != nil {
		return err
	}
	var inPart int64
	part := "processed_event_p" + day.Format("20060102")
	if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM `+part).Scan(&inPart); err != nil {
		return err
	}
	fmt.Printf("seed: %d rows of %s (UUIDv7 ids of that day) into %s by COPY in %s\n",
		n, day.Format("2006-01-02"), part, time.Since(start).Round(time.Millisecond))

	var dropped []string
	var rescued int
	var dropTime time.Duration
	load, err := drive(ctx, o, drv, func(ctx context.Context, clk *clock) error {
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
		clk.set(with)
		t := time.Now()
		var err error
		dropped, rescued, err = drv.DropInboxPartitionsBefore(ctx, day.AddDate(0, 0, 1))
		dropTime = time.Since(t)
		clk.set(without)
		if err != nil {
			return err
		}
		return sleepCtx(ctx, time.Second)
	})
	if err != nil {
		return err
	}
	fmt.Printf("drop one day of %d rows (DETACH + keep young rows + DROP): %s; partitions dropped %v, rows kept %d\n",
		inPart, dropTime.Round(100*time.Microsecond), dropped, rescued)
	printHeader()
	load[without].print("2s around the drop")
	load[with].print("during the drop")
	return nil
}

// dayRows yields n rows with UUIDv7 ids spread over day, processed then.
type dayRows struct {
	day time.Time
	n   int
	i   int
}

func (r *dayRows) Next() bool { r.i++; return r.i <= r.n }

func (r *dayRows) Values() ([]any, error) {
	at := r.day.Add(time.Duration(r.i) * (24 * time.Hour / time.Duration(r.n+1)))
	id := uuid.New()
	b := pgdriver.InboxPartitionBound(at)
	copy(id[:6], b[:6])
	id[6] = 0x70 | id[6]&0x0f
	return []any{id, "bench-old", at}, nil
}

func (r *dayRows) Err() error { return nil }
