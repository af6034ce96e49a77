package cleanup

import (
	"context"
	"errors"
	"time"

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
	// DeleteInboxDefaultBefore deletes at most limit rows of the default
	// partition processed before before, and returns how many.
	DeleteInboxDefaultBefore(ctx context.Context, before time.Time, limit int) (int, error)
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
		deleteBatch: func(ctx context.Context, _ driver.Executor, before time.Time, limit int) (int, error) {
			return p.DeleteInboxDefaultBefore(ctx, before, limit)
		},
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
