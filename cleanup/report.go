package cleanup

import "time"

// Report is what one RunOnce did.
type Report struct {
	// Skipped is true when the sweep did not run: another replica holds
	// the lease (or this Cleaner was already sweeping). Tables is then
	// empty.
	Skipped bool
	// Owner is this Cleaner's lease owner id.
	Owner string
	// Started is Config.Now at the start of the sweep; every cutoff is
	// computed from it.
	Started time.Time
	// Duration is the wall time of the whole RunOnce.
	Duration time.Duration
	// Tables has one entry per table swept, in sweep order.
	Tables []TableReport
	// Err is the error RunOnce returned, or nil: the tables' errors
	// joined, and failures no table reports (the lease could not be
	// taken or was lost, ctx ended between tables).
	Err error
	// Interrupted is true when the sweep stopped because RunOnce's context
	// was cancelled (Run's context: the process is shutting down) before
	// it was done; Err is then set too. Nothing failed: the next sweep
	// carries on where this one stopped, so it is logged at Info, not
	// Error. A context that passed its deadline is a failure, not an
	// interruption: the sweep did not fit in the time it was given; so is
	// a sweep in which a table had failed before the cancellation.
	Interrupted bool
}

// TableReport is the sweep of one table.
type TableReport struct {
	// Table is the rule's name (TableRecords, TableInbox, TableOutbox,
	// TableSagas or a Rule's Table).
	Table string
	// Before is the cutoff: rows older than it were deleted.
	Before time.Time
	// Deleted is how many rows the DELETE statements reported removed (for
	// TableSagas: sagas, each with its steps). A statement interrupted by a
	// cancelled context may have removed rows it could not report.
	Deleted int
	// Batches is how many DELETE statements ran.
	Batches int
	// PartitionsCreated and PartitionsDropped name the inbox partitions a
	// sweep in partition mode created ahead and dropped whole (their rows
	// are not counted in Deleted).
	PartitionsCreated []string
	PartitionsDropped []string
	// Rescued is how many rows of dropped partitions were still younger
	// than the cutoff (by processed_at) and were moved to the default
	// partition instead of being dropped.
	Rescued int
	// Duration is the time spent on this table, pauses included.
	Duration time.Duration
	// Err is the error that stopped this table's sweep, or nil; when
	// the sweep panicked, an error saying so, with the panic.
	Err error
}

// Deleted returns the rows deleted from table (0 if it was not swept).
func (r Report) Deleted(table string) int {
	for _, t := range r.Tables {
		if t.Table == table {
			return t.Deleted
		}
	}
	return 0
}

// TotalDeleted returns the rows deleted from every table.
func (r Report) TotalDeleted() int {
	n := 0
	for _, t := range r.Tables {
		n += t.Deleted
	}
	return n
}
