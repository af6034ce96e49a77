package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/idemkit/idem/driver"
)

// InboxPartitioner is the partition mode of processed_event, implemented by
// drivers that have one (pgdriver.Driver). The cleaner uses it when
// Config.PartitionedInbox is set.
type InboxPartitioner interface {
	// InboxPartitioned reports whether processed_event is partitioned.
	InboxPartitioned(ctx context.Context) (bool, error)
	// EnsureInboxPartitions creates the daily partitions from the day of
	// now to ahead days after it that do not exist yet, and returns their
	// names.
	EnsureInboxPartitions(ctx context.Context, now time.Time, ahead int) (created []string, err error)
	// DropInboxPartitionsBefore drops every daily partition whose whole
	// range is older than before, after moving its rows processed at or
	// after before to the default partition; a partition with too many
	// such rows to move under a brief lock is kept for a later call. It
	// returns the dropped partitions and how many rows were moved.
	DropInboxPartitionsBefore(ctx context.Context, before time.Time) (dropped []string, rescued int, err error)
	// DeleteInboxDefaultBefore deletes at most p.Limit rows of the default
	// partition of p.Consumer ("" for every consumer) processed before
	// p.Before, from p.After on, and returns how many it deleted and the
	// last one's key, as driver.InboxExecutor's InboxDeleteBefore does: the
	// cleaner passes each batch's Last as the next batch's After.
	DeleteInboxDefaultBefore(ctx context.Context, p *driver.InboxDeleteBeforeParams) (driver.DeleteResult[driver.InboxCursor], error)
}

// ErrInboxPartitioning reports a partition mode that does not match the
// table: Config.PartitionedInbox is set but processed_event is not
// partitioned, or the reverse.
var ErrInboxPartitioning = errors.New("cleanup: inbox partitioning does not match Config.PartitionedInbox")

// partitionedInboxRule sweeps processed_event in partition mode: create
// partitions ahead, drop whole expired days, then DELETE the default
// partition's old rows in batches.
func partitionedInboxRule(p InboxPartitioner, ttl time.Duration, ahead int) sweepRule {
	return sweepRule{
		table:  TableInbox,
		cutoff: olderThan(ttl),
		before: func(ctx context.Context, before, now time.Time, tr *TableReport) error {
			ok, err := p.InboxPartitioned(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return errors.Join(ErrInboxPartitioning, errors.New("processed_event is not partitioned: call the driver's EnableInboxPartitioning first"))
			}
			if tr.PartitionsCreated, err = p.EnsureInboxPartitions(ctx, now, ahead); err != nil {
				return err
			}
			tr.PartitionsDropped, tr.Rescued, err = p.DropInboxPartitionsBefore(ctx, before)
			return err
		},
		batches: keyset(func(ctx context.Context, _ driver.Executor, before time.Time, limit int, after driver.InboxCursor) (driver.DeleteResult[driver.InboxCursor], error) {
			return p.DeleteInboxDefaultBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: "", Before: before, Limit: limit, After: after})
		}),
	}
}

// partitionProbe tells whether processed_event is partitioned: drivers with
// partition mode (pgdriver), and PostgreSQL drivers without it
// (pgsqldriver), whose table another driver may have converted.
type partitionProbe interface {
	InboxPartitioned(ctx context.Context) (bool, error)
}

// unpartitionedCheck refuses to sweep a partitioned processed_event with
// row DELETEs when partition mode is off: that table is maintained by
// dropping partitions, and its partitions would never be created ahead.
func unpartitionedCheck(p partitionProbe) func(context.Context, time.Time, time.Time, *TableReport) error {
	if p == nil {
		return nil
	}
	return func(ctx context.Context, _, _ time.Time, _ *TableReport) error {
		ok, err := p.InboxPartitioned(ctx)
		if err != nil {
			return err
		}
		if ok {
			return errors.Join(ErrInboxPartitioning, errors.New("processed_event is partitioned: set Config.PartitionedInbox"))
		}
		return nil
	}
}

// checkPartitionSchedule refuses, in partition mode, a schedule whose
// sweeps are further apart than the partitions each sweep creates ahead: a
// sweep at f creates the partitions up to the end of the UTC day
// PartitionsAhead days after f's, and the events from then until the next
// sweep would land in the DEFAULT partition. It follows the coming year of
// the schedule from now, sweep by sweep, but at least an hour at a time:
// from an instant t that is not a sweep, the last sweep came at or before
// t, so Next(t) too must come before the end of the UTC day
// PartitionsAhead days after t's.
func checkPartitionSchedule(spec string, s cron.Schedule, loc *time.Location, ahead int, now time.Time) error {
	const day = 24 * time.Hour
	need := ahead
	var from, to time.Time
	end := now.AddDate(1, 0, 0)
	for t := now; t.Before(end); {
		g := nextOnWallClock(s, t, loc)
		if g.IsZero() {
			break
		}
		y, m, d := t.UTC().Date()
		span := g.Sub(time.Date(y, m, d, 0, 0, 0, 0, time.UTC)) // from the start of t's UTC day
		if n := int((span+day-1)/day) - 1; n > need {
			need, from, to = n, t, g
		}
		if t = t.Add(time.Hour); g.After(t) {
			t = g
		}
	}
	if need <= ahead {
		return nil
	}
	return fmt.Errorf("Config.Schedule %q: after %s its next sweep is at %s, but in partition mode a sweep creates the inbox partitions of the next PartitionsAhead (%d) days only: "+
		"the events in between would land in the DEFAULT partition, which the next sweep moves under an exclusive lock and deletes row by row; "+
		"set PartitionsAhead to at least %d, or sweep more often",
		spec, from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), ahead, need)
}
