package cleanup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/dbclock"
	"github.com/idemkit/idem/internal/leaseowner"
	"github.com/idemkit/idem/internal/txnil"
	"github.com/idemkit/idem/observe"
)

// Cleaner deletes what idem's tables no longer need, in small batches, on a
// schedule (Run) or on demand (RunOnce). With several replicas sharing a
// database, exactly one of them runs a given sweep: the one that takes the
// lease Config.LockName; the others skip it.
//
// A Cleaner is safe for concurrent use; a RunOnce called while the same
// Cleaner is sweeping reports Skipped.
type Cleaner[TTx any] struct {
	drv     driver.Driver[TTx]
	cfg     Config
	sched   cron.Schedule
	rules   []sweepRule
	owner   string
	running atomic.Bool
	// clock is the default clock (Config.Now not set): the host's,
	// corrected by the database's (nil otherwise).
	clock *dbclock.Clock
}

// New returns a Cleaner for the tables of drv. cfg may be nil for the
// defaults. A misconfiguration (a retention outside the R-DIST-IDEM-5 bounds
// without a reason, a bad cron expression, partition mode on a driver without
// it) is an error here, never a surprise at 03:00.
func New[TTx any](drv driver.Driver[TTx], cfg *Config) (*Cleaner[TTx], error) {
	if txnil.Is(drv) { // nil, or a nil *Driver from an Open whose error was ignored
		return nil, errors.New("cleanup: nil driver")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	defaultNow := c.Now == nil
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var clock *dbclock.Clock
	if defaultNow {
		// The cut-offs are compared with times other replicas wrote, and
		// the lease with their clocks: the database's clock is the one
		// they share.
		clock = dbclock.New(drv, c.Logger, "cleanup")
		c.Now = clock.Now
	}
	sched, _ := parseSchedule(c.Schedule, c.Location) // validated above
	probe, _ := any(drv).(InboxPartitioner)
	check, _ := any(drv).(partitionProbe)
	if c.PartitionedInbox && probe == nil {
		return nil, fmt.Errorf("cleanup: invalid config: PartitionedInbox: the %s driver has no inbox partition mode (it does not implement cleanup.InboxPartitioner)", drv.Name())
	}
	cl := &Cleaner[TTx]{
		drv:   drv,
		cfg:   c,
		sched: sched,
		rules: c.builtinRules(probe, check),
		owner: leaseowner.New(),
		clock: clock,
	}
	cl.logConfig()
	return cl, nil
}

// logConfig reports overrides and finished sagas deleted before the inbox
// forgets their events (a window shorter than the redelivery horizon is
// refused by validate).
func (c *Cleaner[TTx]) logConfig() {
	in, sg := c.cfg.Inbox, c.cfg.Sagas
	if !in.Disabled {
		if in.TTL < MinTTL || in.TTL > MaxTTL {
			c.cfg.Logger.Warn("cleanup: inbox retention outside the R-DIST-IDEM-5 bounds, allowed by override",
				"ttl", in.TTL, "min", MinTTL, "max", MaxTTL, "reason", in.OverrideReason)
		}
	}
	if sg.Disabled {
		return
	}
	if sg.TTL < MinTTL {
		c.cfg.Logger.Warn("cleanup: finished-saga retention under the R-DIST-IDEM-5 minimum, allowed by override",
			"ttl", sg.TTL, "min", MinTTL, "reason", sg.OverrideReason)
	}
	var inboxTTL time.Duration
	if !in.Disabled {
		inboxTTL = in.TTL
	}
	if sg.TTL < inboxTTL { // one shorter than the redelivery horizon is refused by validate
		c.cfg.Logger.Warn("cleanup: MISCONFIGURATION: finished sagas are deleted before the inbox forgets their events; "+
			"a late event of a deleted saga finds no saga, or starts it again",
			"saga_ttl", sg.TTL, "inbox_ttl", inboxTTL)
	}
}

// Owner returns the id this Cleaner writes into the lease row: host name,
// process id and a random suffix, unique per Cleaner.
func (c *Cleaner[TTx]) Owner() string { return c.owner }

// RunOnce sweeps every configured table now, if this replica gets the lease
// (Report.Skipped otherwise). Each table is deleted in batches of at most
// Config.BatchSize rows until a batch deletes fewer, with Config.Pause
// between batches. A table whose sweep fails does not stop the others; the
// errors are joined. When ctx is done the sweep stops within one statement
// and RunOnce returns ctx's error with what was done so far (with
// Report.Interrupted set when ctx was cancelled). A panic during the sweep
// (of the driver or of a Rule) releases the lease, ends the sweep's span
// and reports the sweep to OnSweep as failed, with the panic as its error
// (and as the error of the table whose sweep panicked, in Report.Tables),
// then goes on.
func (c *Cleaner[TTx]) RunOnce(ctx context.Context) (rep Report, err error) {
	wall := time.Now()
	// The default clock follows the database's (one query per sweep): a
	// host whose clock runs ahead must not cut off rows other replicas
	// wrote inside their retention.
	c.clock.Sync(ctx)
	rep = Report{Owner: c.owner, Started: c.cfg.Now()}
	ctx, span := observe.Start(ctx, c.cfg.Tracer, "idem.cleanup.sweep")
	defer func() {
		p := recover()
		if p != nil {
			err = fmt.Errorf("cleanup: sweep panicked: %v", p)
		}
		rep.Duration = time.Since(wall)
		rep.Err = err
		rep.Interrupted = p == nil && err != nil && errors.Is(ctx.Err(), context.Canceled) && !tableFailed(ctx, rep.Tables)
		if c.cfg.Tracer != nil {
			span.SetAttributes(observe.Bool("idem.cleanup.skipped", rep.Skipped),
				observe.Int("idem.cleanup.deleted", rep.TotalDeleted()), observe.Int("idem.cleanup.tables", len(rep.Tables)))
			observe.End(span, err)
		}
		c.logReport(rep, err)
		if c.cfg.OnSweep != nil {
			c.cfg.OnSweep(rep)
		}
		if p != nil {
			panic(p)
		}
	}()
	err = c.runOnce(ctx, &rep)
	return rep, err
}

// tableFailed reports whether a table's sweep failed for another reason
// than ctx's cancellation: that sweep is a failure, not an interruption.
func tableFailed(ctx context.Context, tables []TableReport) bool {
	for _, t := range tables {
		if t.Err != nil && !errors.Is(t.Err, context.Canceled) && !errors.Is(t.Err, context.Cause(ctx)) {
			return true
		}
	}
	return false
}

func (c *Cleaner[TTx]) runOnce(ctx context.Context, rep *Report) error {
	if !c.running.CompareAndSwap(false, true) {
		rep.Skipped = true
		return nil
	}
	defer c.running.Store(false)

	held, err := c.acquire(ctx, rep.Started)
	if err != nil {
		return err
	}
	if !held {
		rep.Skipped = true
		return nil
	}
	sweepCtx, stop := c.keepLease(ctx, rep.Started.Add(c.cfg.Lease))
	swept := false
	defer func() {
		if !swept { // the sweep panicked: stop renewing the lease, release it; the panic goes on
			stop()
			c.finish(ctx, false)
		}
	}()
	err = c.sweep(sweepCtx, rep)
	swept = true
	stop()
	if cause := context.Cause(sweepCtx); errors.Is(cause, driver.ErrLeaseLost) && !errors.Is(err, driver.ErrLeaseLost) {
		err = errors.Join(err, cause) // lost after the last statement
	}
	c.finish(ctx, err == nil)
	return err
}

// sweep runs every rule with the cutoffs of rep.Started.
func (c *Cleaner[TTx]) sweep(ctx context.Context, rep *Report) error {
	ex := c.drv.Executor()
	var errs []error
	for _, r := range c.rules {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, context.Cause(ctx))...)
		}
		tr := c.sweepReported(ctx, ex, r, rep)
		if tr.Err != nil {
			errs = append(errs, fmt.Errorf("cleanup: %s: %w", r.table, tr.Err))
		}
	}
	return errors.Join(errs...)
}

// sweepReported sweeps r's table and adds its TableReport to rep. When
// the sweep panics (a driver's or a Rule's bug), the table is reported
// with the panic as its error, and the panic goes on: RunOnce reports the
// sweep, the failing table among its tables, to OnSweep and the log.
func (c *Cleaner[TTx]) sweepReported(ctx context.Context, ex driver.Executor, r sweepRule, rep *Report) (tr TableReport) {
	tr = TableReport{Table: r.table, Before: r.cutoff(rep.Started)}
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			tr.Err = fmt.Errorf("sweep panicked: %v", p)
			tr.Duration = time.Since(start)
			rep.Tables = append(rep.Tables, tr)
			panic(p)
		}
	}()
	tr.Err = c.sweepTable(ctx, ex, r, rep.Started, &tr)
	tr.Duration = time.Since(start)
	rep.Tables = append(rep.Tables, tr)
	return tr
}

// sweepTable deletes one table's old rows in bounded batches.
func (c *Cleaner[TTx]) sweepTable(ctx context.Context, ex driver.Executor, r sweepRule, now time.Time, tr *TableReport) error {
	if r.before != nil {
		if err := r.before(ctx, tr.Before, now, tr); err != nil {
			return err
		}
	}
	deleteBatch := r.batches() // this sweep's: its first batch starts from the oldest row
	for {
		n, err := deleteBatch(ctx, ex, tr.Before, c.cfg.BatchSize)
		tr.Batches++
		tr.Deleted += n
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
		if n < c.cfg.BatchSize {
			return nil
		}
		if err := sleep(ctx, c.cfg.Pause); err != nil {
			return err
		}
	}
}

func (c *Cleaner[TTx]) logReport(rep Report, err error) {
	log := c.cfg.Logger
	if rep.Skipped {
		log.Debug("cleanup: sweep skipped: another replica holds the lease", "lock", c.cfg.LockName, "owner", c.owner)
		return
	}
	attrs := []any{slog.Duration("duration", rep.Duration), slog.Int("deleted", rep.TotalDeleted())}
	for _, t := range rep.Tables {
		attrs = append(attrs, slog.Group(t.Table, "deleted", t.Deleted, "batches", t.Batches,
			"dropped_partitions", len(t.PartitionsDropped), "duration", t.Duration))
	}
	switch {
	case rep.Interrupted:
		log.Info("cleanup: sweep interrupted: its context was cancelled (shutting down); the next sweep goes on", append(attrs, "err", err)...)
	case err != nil:
		log.Error("cleanup: sweep failed", append(attrs, "err", err)...)
	default:
		log.Info("cleanup: sweep done", attrs...)
	}
}

// sleep waits d (nothing for NoPause), or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if !backoff.Sleep(ctx, d, nil) {
		return context.Cause(ctx)
	}
	return nil
}
