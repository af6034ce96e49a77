package cleanup

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/idem/observe"
)

// Bounds of the retention of idempotency records and of the inbox
// (R-DIST-IDEM-5). A shorter window lets a late retry or redelivery execute
// twice; a longer one grows the tables for nothing. Either needs an
// OverrideReason.
const (
	MinTTL = 24 * time.Hour
	MaxTTL = 72 * time.Hour
)

// Defaults of Config.
const (
	DefaultInboxTTL  = 72 * time.Hour
	DefaultOutboxTTL = 24 * time.Hour
	DefaultSagaTTL   = 72 * time.Hour
	DefaultBatchSize = 1000
	DefaultPause     = 50 * time.Millisecond
	DefaultSchedule  = "0 3 * * *"
	DefaultLease     = time.Minute
	DefaultHold      = time.Minute
	DefaultLockName  = "idem-cleanup"
	// DefaultPartitionsAhead is how many days of inbox partitions are kept
	// created ahead of today in partition mode.
	DefaultPartitionsAhead = 3
)

// NoPause as Config.Pause runs the batches back to back.
const NoPause time.Duration = -1

// NoHold as Config.Hold releases the lease as soon as a sweep ends.
const NoHold time.Duration = -1

// Config configures a Cleaner. The zero value gives the defaults.
type Config struct {
	// Records is the retention of HTTP idempotency records
	// (idempotency_record). Their lifetime is set where they are written
	// (idemhttp.Config.TTL, validated there to 24h..72h); the cleaner
	// deletes the records whose expires_at has passed.
	Records RecordRetention

	// Inbox is the retention of the consumer inbox (processed_event).
	Inbox InboxRetention

	// Outbox is the retention of published outbox rows.
	Outbox OutboxRetention

	// Sagas is the retention of finished sagas (tables saga and saga_step,
	// written by package saga).
	Sagas SagaRetention

	// Rules are further tables to sweep (an application's own tables),
	// after the built-in ones, in order. Defaults to none.
	Rules []Rule

	// PartitionedInbox selects the PostgreSQL partition mode of the inbox:
	// whole days of processed_event are dropped instead of deleted (see the
	// package documentation). The driver must implement InboxPartitioner
	// (pgdriver does) and processed_event must have been converted with
	// pgdriver's EnableInboxPartitioning. It needs the inbox sweep
	// (Inbox.Disabled false), which creates the partitions ahead. Defaults
	// to false.
	PartitionedInbox bool
	// PartitionsAhead is how many days of inbox partitions each sweep keeps
	// created ahead of today in partition mode. Defaults to 3. It must
	// cover the time between two sweeps of Schedule: New refuses a
	// schedule whose next sweep comes after the end of the UTC day
	// PartitionsAhead days after a sweep's (a weekly schedule needs 7).
	PartitionsAhead int

	// BatchSize is the most rows one DELETE statement removes. A table is
	// swept in batches until a batch deletes fewer rows. Defaults to 1000.
	BatchSize int
	// Pause is the wait between two batches of a table, so that a sweep
	// leaves room to the application's writes and to replication. Defaults
	// to 50ms; NoPause runs the batches back to back.
	Pause time.Duration

	// Schedule is when Run sweeps: a cron expression with five fields
	// (minute hour day-of-month month day-of-week), a descriptor such as
	// "@daily" or "@every 6h", optionally prefixed with "CRON_TZ=Zone ".
	// It is validated by New. Defaults to "0 3 * * *": daily at 03:00,
	// off-peak. It is read on the wall clock of its time zone: on the days
	// the clocks change, a time they skip sweeps when they jump past it,
	// and a time they repeat sweeps once, at its first occurrence (a daily
	// schedule sweeps once every day).
	Schedule string
	// Location is the time zone of Schedule (a CRON_TZ= prefix takes
	// precedence). Defaults to time.Local.
	Location *time.Location

	// LockName is the lease (table idem_lock) that makes exactly one replica
	// run a sweep. Cleaners that share a database and must not sweep at
	// once use the same name. A cleaner that finds the lease held skips its
	// whole run (it does not wait for it), so cleaners sharing a name must
	// sweep the same tables and Rules: give a cleaner with other Rules a
	// name of its own. Defaults to "idem-cleanup".
	LockName string
	// Lease is how long the lease lives without renewal; the cleaner renews
	// it every Lease/3 while it sweeps (a failed renewal is retried after
	// 100ms, doubling up to Lease/3), so only a dead replica's lease
	// expires. Defaults to 1m; at least 1s.
	Lease time.Duration
	// Hold is how long a replica keeps the lease after its sweep ended, so
	// that replicas woken by the same schedule slightly later (timer jitter,
	// clock skew) skip that run instead of sweeping again. The holder itself
	// may sweep again at any time. Defaults to 1m; NoHold releases the lease
	// at once.
	Hold time.Duration

	// Now is the clock that decides what is old and when leases expire.
	// The cut-offs are compared with times other replicas wrote, on other
	// hosts. Defaults to the host's clock corrected by the database's
	// when the driver is a driver.Clock (idem's drivers are), measured at
	// each sweep with one query: a host whose clock runs ahead (hours,
	// days) deletes nothing inside its retention, and a host more than 1s
	// off is logged (WARN "this host's clock disagrees with the
	// database's"). A Now set here is used as is: a cleaner ahead by d
	// deletes rows up to d early.
	Now func() time.Time
	// Logger receives the sweep summaries (Info), skipped sweeps (Debug),
	// misconfigurations (Warn) and errors. Defaults to slog.Default().
	Logger *slog.Logger
	// OnSweep, if set, is called after every RunOnce (skipped or not) with
	// its report: rows deleted per table, durations and Report.Err (a
	// failed sweep), for metrics. A sweep that panicked is reported too,
	// failed, before the panic goes on.
	// Defaults to nil.
	OnSweep func(Report)
	// Tracer, if set, traces every RunOnce with an idem.cleanup.sweep
	// span (attributes idem.cleanup.skipped, idem.cleanup.deleted and
	// idem.cleanup.tables). Nil (the default) traces nothing.
	Tracer observe.Tracer
}

// RecordRetention configures the sweep of idempotency_record.
type RecordRetention struct {
	// Disabled leaves the table alone. Defaults to false.
	Disabled bool
}

// InboxRetention configures the sweep of processed_event.
type InboxRetention struct {
	// Disabled leaves the table alone. Defaults to false.
	Disabled bool
	// TTL is how long a processed event is remembered after processed_at.
	// Defaults to 72h. Outside 24h..72h it needs OverrideReason.
	TTL time.Duration
	// OverrideReason allows a TTL outside 24h..72h; it is logged by New.
	OverrideReason string
	// RedeliveryHorizon is the longest time after which an event can still
	// be delivered again: the topic's retention, or the largest consumer
	// lag you tolerate. An event redelivered after its dedup row was deleted
	// is applied twice, so New refuses a TTL shorter than the horizon (and a
	// Sagas.TTL shorter than it), whatever OverrideReason says. Defaults to
	// 0 (unknown: no check).
	RedeliveryHorizon time.Duration
}

// OutboxRetention configures the sweep of published outbox rows. Rows not
// yet published (and parked ones) are never deleted.
type OutboxRetention struct {
	// Disabled leaves the table alone. Defaults to false.
	Disabled bool
	// TTL is how long a row is kept after it was published (for audits and
	// manual republishing). Defaults to 24h.
	TTL time.Duration
}

// SagaRetention configures the sweep of finished sagas. A saga is finished
// when it is Completed or Compensated; running, compensating and failed
// sagas are never deleted, however old. A finished saga is deleted with its
// steps.
type SagaRetention struct {
	// Disabled leaves the tables alone. Defaults to false.
	Disabled bool
	// TTL is how long a saga is kept after it finished (its finished_at).
	// Defaults to 72h. Less than 24h needs OverrideReason; there is no
	// upper bound (a finished saga is an audit trail, and keeping it longer
	// only costs space). Keep it at least as long as Inbox.TTL and
	// Inbox.RedeliveryHorizon: an event of a deleted saga that arrives
	// later finds no saga (saga.ErrNotFound), and an event that starts the
	// saga creates it anew and runs its steps again. New refuses a TTL
	// shorter than the horizon and logs a warning when it is shorter than
	// Inbox.TTL.
	TTL time.Duration
	// OverrideReason allows a TTL under 24h; it is logged by New.
	OverrideReason string
}

func (c Config) withDefaults() Config {
	if c.Inbox.TTL == 0 {
		c.Inbox.TTL = DefaultInboxTTL
	}
	if c.Outbox.TTL == 0 {
		c.Outbox.TTL = DefaultOutboxTTL
	}
	if c.Sagas.TTL == 0 {
		c.Sagas.TTL = DefaultSagaTTL
	}
	if c.PartitionsAhead == 0 {
		c.PartitionsAhead = DefaultPartitionsAhead
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Pause == 0 {
		c.Pause = DefaultPause
	}
	if c.Schedule == "" {
		c.Schedule = DefaultSchedule
	}
	if c.Location == nil {
		c.Location = time.Local
	}
	if c.LockName == "" {
		c.LockName = DefaultLockName
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Hold == 0 {
		c.Hold = DefaultHold
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if !c.Inbox.Disabled {
		if c.Inbox.TTL <= 0 {
			errs = append(errs, fmt.Errorf("Inbox.TTL %s must be positive", c.Inbox.TTL))
		} else if (c.Inbox.TTL < MinTTL || c.Inbox.TTL > MaxTTL) && strings.TrimSpace(c.Inbox.OverrideReason) == "" {
			errs = append(errs, fmt.Errorf("Inbox.TTL %s is outside %s..%s (R-DIST-IDEM-5): shorter lets a redelivered event be applied twice, longer grows the table; set Inbox.OverrideReason to allow it", c.Inbox.TTL, MinTTL, MaxTTL))
		}
		if c.Inbox.RedeliveryHorizon < 0 {
			errs = append(errs, fmt.Errorf("Inbox.RedeliveryHorizon %s must not be negative", c.Inbox.RedeliveryHorizon))
		} else if c.Inbox.TTL > 0 && c.Inbox.TTL < c.Inbox.RedeliveryHorizon {
			errs = append(errs, fmt.Errorf("Inbox.TTL %s is shorter than Inbox.RedeliveryHorizon %s: an event redelivered after its processed_event row is deleted is applied twice; lengthen Inbox.TTL (beyond %s with Inbox.OverrideReason), or shorten the topic's retention and the horizon", c.Inbox.TTL, c.Inbox.RedeliveryHorizon, MaxTTL))
		}
	}
	if !c.Outbox.Disabled && c.Outbox.TTL <= 0 {
		errs = append(errs, fmt.Errorf("Outbox.TTL %s must be positive", c.Outbox.TTL))
	}
	if !c.Sagas.Disabled {
		if c.Sagas.TTL <= 0 {
			errs = append(errs, fmt.Errorf("Sagas.TTL %s must be positive", c.Sagas.TTL))
		} else if c.Sagas.TTL < MinTTL && strings.TrimSpace(c.Sagas.OverrideReason) == "" {
			errs = append(errs, fmt.Errorf("Sagas.TTL %s is under %s: a late event of a deleted saga finds no saga, or starts it again; set Sagas.OverrideReason to allow it", c.Sagas.TTL, MinTTL))
		}
		if c.Sagas.TTL > 0 && c.Sagas.TTL < c.Inbox.RedeliveryHorizon {
			errs = append(errs, fmt.Errorf("Sagas.TTL %s is shorter than Inbox.RedeliveryHorizon %s: an event redelivered after its saga is deleted finds no saga, or starts it again; lengthen Sagas.TTL", c.Sagas.TTL, c.Inbox.RedeliveryHorizon))
		}
	}
	errs = append(errs, validateRules(c.Rules)...)
	if c.PartitionsAhead < 1 {
		errs = append(errs, fmt.Errorf("PartitionsAhead %d must be at least 1", c.PartitionsAhead))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("BatchSize %d must be positive", c.BatchSize))
	}
	if c.PartitionedInbox && c.Inbox.Disabled {
		errs = append(errs, errors.New("PartitionedInbox with Inbox.Disabled: the inbox sweep is what creates the day partitions ahead, so every insert would go to the DEFAULT partition for ever; sweep the inbox here, or leave PartitionedInbox unset in a cleaner that does not sweep it"))
	}
	if c.Pause < 0 && c.Pause != NoPause {
		errs = append(errs, fmt.Errorf("Config.Pause %s must be positive or NoPause", c.Pause))
	}
	if s, err := parseSchedule(c.Schedule, c.Location); err != nil {
		errs = append(errs, err)
	} else if c.PartitionedInbox && !c.Inbox.Disabled && c.PartitionsAhead >= 1 {
		if err := checkPartitionSchedule(c.Schedule, s, c.Location, c.PartitionsAhead, c.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	if !lockNameRe.MatchString(c.LockName) {
		errs = append(errs, fmt.Errorf("LockName %q must be 1-200 printable ASCII characters", c.LockName))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("Config.Lease %s must be at least 1s", c.Lease))
	}
	if c.Hold < 0 && c.Hold != NoHold {
		errs = append(errs, fmt.Errorf("Config.Hold %s must be positive or NoHold", c.Hold))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: invalid config: %w", err)
	}
	return nil
}
