package cleanup

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/idemkit/idem/driver"
)

// Names of the built-in rules, as they appear in a Report.
const (
	TableRecords = "idempotency_record"
	TableInbox   = "processed_event"
	TableOutbox  = "outbox"
	// TableSagas is the sweep of finished sagas (table saga, whose steps
	// in saga_step go with them). Its Deleted counts sagas.
	TableSagas = "saga"
)

// Rule is one more table for the cleaner to sweep: the extension point for
// an application's own tables, swept after the built-in ones.
type Rule struct {
	// Table names the rule in reports and logs. Required, unique, and not
	// one of the built-in names.
	Table string
	// TTL is the age past which rows are deleted: Delete receives
	// now - TTL as before. Zero passes now itself, for rows that carry
	// their own expiry time. Must not be negative.
	TTL time.Duration
	// Delete deletes at most limit rows that are older than before, with
	// ONE bounded statement run through ex (which commits on its own), and
	// returns how many it deleted. The cleaner calls it again, after
	// Config.Pause, while it returns limit, with no cursor: unlike the
	// built-in deletes' batches, each call is on its own (see Batches in
	// the package documentation). Required.
	Delete func(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int, error)
}

var lockNameRe = regexp.MustCompile(`^[\x21-\x7e][\x20-\x7e]{0,199}$`)

func validateRules(rules []Rule) []error {
	var errs []error
	seen := map[string]bool{TableRecords: true, TableInbox: true, TableOutbox: true, TableSagas: true}
	for i, r := range rules {
		switch {
		case r.Table == "":
			errs = append(errs, fmt.Errorf("Config.Rules[%d]: Table is required", i))
		case seen[r.Table]:
			errs = append(errs, fmt.Errorf("Config.Rules[%d]: Table %q is used twice or is a built-in table", i, r.Table))
		}
		seen[r.Table] = true
		if r.TTL < 0 {
			errs = append(errs, fmt.Errorf("Config.Rules[%d] (%s): TTL %s must not be negative", i, r.Table, r.TTL))
		}
		if r.Delete == nil {
			errs = append(errs, fmt.Errorf("Config.Rules[%d] (%s): Delete is required", i, r.Table))
		}
	}
	return errs
}

// sweepRule is what a sweep runs for one table: either a batched delete (the
// built-in DELETE rules and Config.Rules) or a custom pass (partition mode).
type sweepRule struct {
	table string
	// cutoff maps the sweep's now to the "older than" bound.
	cutoff func(now time.Time) time.Time
	// batches returns the batched delete of one sweep: each call of the
	// function it returns deletes at most limit rows older than before,
	// after those of the calls before it (the built-in rules pass the
	// cursor of one batch to the next; see driver.DeleteResult).
	batches func() batchFunc
	// before, if set, runs once ahead of the batches (partition
	// maintenance) and fills in the table report.
	before func(ctx context.Context, before, now time.Time, tr *TableReport) error
}

// batchFunc deletes one batch of at most limit rows older than before, and
// returns how many it deleted.
type batchFunc func(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int, error)

// keyset returns the batches of a driver's retention delete: each sweep
// starts from the zero cursor, and each batch resumes after the last row
// the batch before it deleted.
func keyset[C any](del func(ctx context.Context, ex driver.Executor, before time.Time, limit int, after C) (driver.DeleteResult[C], error)) func() batchFunc {
	return func() batchFunc {
		var after C
		return func(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int, error) {
			res, err := del(ctx, ex, before, limit, after)
			if err == nil {
				after = res.Last
			}
			return res.Deleted, err
		}
	}
}

// stateless returns the batches of a delete that keeps no cursor (a Rule's).
func stateless(del batchFunc) func() batchFunc { return func() batchFunc { return del } }

func olderThan(ttl time.Duration) func(time.Time) time.Time {
	return func(now time.Time) time.Time { return now.Add(-ttl) }
}

// builtinRules returns the sweep rules of c, in sweep order.
// partitioner is the driver's partition mode, nil when it has none; probe
// tells whether the table is partitioned, nil when the driver cannot.
func (c *Config) builtinRules(partitioner InboxPartitioner, probe partitionProbe) []sweepRule {
	var rules []sweepRule
	if !c.Records.Disabled {
		rules = append(rules, sweepRule{
			table:  TableRecords,
			cutoff: func(now time.Time) time.Time { return now },
			batches: keyset(func(ctx context.Context, ex driver.Executor, before time.Time, limit int, after driver.RecordCursor) (driver.DeleteResult[driver.RecordCursor], error) {
				return ex.RecordDeleteExpired(ctx, &driver.RecordDeleteExpiredParams{Now: before, Limit: limit, After: after})
			}),
		})
	}
	if !c.Inbox.Disabled {
		if c.PartitionedInbox {
			rules = append(rules, partitionedInboxRule(partitioner, c.Inbox.TTL, c.PartitionsAhead))
		} else {
			rules = append(rules, sweepRule{
				table:  TableInbox,
				cutoff: olderThan(c.Inbox.TTL),
				before: unpartitionedCheck(probe),
				batches: keyset(func(ctx context.Context, ex driver.Executor, before time.Time, limit int, after driver.InboxCursor) (driver.DeleteResult[driver.InboxCursor], error) {
					return ex.InboxDeleteBefore(ctx, &driver.InboxDeleteBeforeParams{Consumer: "", Before: before, Limit: limit, After: after})
				}),
			})
		}
	}
	if !c.Outbox.Disabled {
		rules = append(rules, sweepRule{
			table:  TableOutbox,
			cutoff: olderThan(c.Outbox.TTL),
			batches: keyset(func(ctx context.Context, ex driver.Executor, before time.Time, limit int, after driver.OutboxCursor) (driver.DeleteResult[driver.OutboxCursor], error) {
				return ex.OutboxDeletePublishedBefore(ctx, &driver.OutboxDeletePublishedBeforeParams{Before: before, Limit: limit, After: after})
			}),
		})
	}
	if !c.Sagas.Disabled {
		rules = append(rules, sweepRule{
			table:  TableSagas,
			cutoff: olderThan(c.Sagas.TTL),
			batches: keyset(func(ctx context.Context, ex driver.Executor, before time.Time, limit int, after driver.SagaCursor) (driver.DeleteResult[driver.SagaCursor], error) {
				return ex.SagaDeleteFinishedBefore(ctx, &driver.SagaDeleteFinishedBeforeParams{Before: before, Limit: limit, After: after})
			}),
		})
	}
	for _, r := range c.Rules {
		rules = append(rules, sweepRule{table: r.Table, cutoff: olderThan(r.TTL), batches: stateless(r.Delete)})
	}
	return rules
}
