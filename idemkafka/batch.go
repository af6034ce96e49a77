package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/flaplog"
)

// failure tracks the record of a partition batch whose handler failed.
type failure struct {
	idx    int // index in the batch; -1 when none
	count  int // failed tries
	poison bool
	err    error
}

// partition applies the records of one partition in order and returns how
// many leading records are handled (applied, duplicates or dead-lettered).
// It stops early, leaving the rest to be polled again, when the database or
// the dead-letter topic keeps failing, or when ctx is done.
func (c *Consumer[TTx]) partition(ctx, work context.Context, cl *kgo.Client, p kgo.FetchTopicPartition) (int, BatchStats) {
	var (
		st       BatchStats
		recs     = p.Records
		evs      = make([]inbox.Event, len(recs))
		envs     = make([]event.Envelope, len(recs)) // evs[i].Payload is &envs[i]
		decErrs  = make([]error, len(recs))
		attempts = c.cfg.Retry.Attempts
		// dbAttempts bounds the tries of a database (or dead-letter
		// topic) failure before the partition is rewound: one for a
		// partition already stalled (a poll gave up on it and it has
		// not moved since), until it moves.
		dbAttempts = attempts
		fail       = failure{idx: -1}
		dbFails    int // consecutive database or dead-letter failures
		single     int // records before it are applied one at a time
		tried      bool
	)
	for i, r := range recs {
		envs[i], decErrs[i] = Envelope(r)
		// Headers carry the producer's trace context to the inbox's spans.
		// A pointer into envs as the payload: an Envelope in an interface
		// would be copied to the heap, once per record.
		evs[i] = inbox.Event{ID: envs[i].ID, Payload: &envs[i], Headers: envs[i].Headers}
	}
	// transient counts a failure that is not the record's fault and
	// reports whether to try again (after a backoff).
	transient := func(err error) bool {
		st.Failures++
		st.Err = err
		dbFails++
		// A partition already reported stalled is logged at ERROR
		// every stallAfter instead (trackStall).
		level := slog.LevelWarn
		if c.stallReported(p.Topic, p.Partition) {
			level = slog.LevelDebug
		}
		// Limited across the consumer's partitions (c.dbLog): a
		// database short of connections fails some transactions and
		// not others, and each batch that failed once logged a line.
		giveUp := dbFails >= dbAttempts
		switch a, ep := c.dbLog.Failed(time.Now()); {
		case a == flaplog.Summary:
			c.cfg.Logger.Log(ctx, level, "idemkafka: batches still failing on the database; repeats are logged at most every "+flaplog.Interval.String(),
				"topic", p.Topic, "partition", p.Partition, "try", dbFails, "err", err,
				"suppressed", ep.Suppressed, "failures", ep.Failures, "ok_batches", ep.Successes, "since", ep.First)
		case a != flaplog.Start:
		case giveUp:
			c.cfg.Logger.Log(ctx, level, "idemkafka: giving up on the batch for now; the partition is rewound and polled again",
				"topic", p.Topic, "partition", p.Partition, "tries", dbFails, "err", err)
		default:
			c.cfg.Logger.Log(ctx, level, "idemkafka: batch failed; retrying",
				"topic", p.Topic, "partition", p.Partition, "try", dbFails, "err", err)
		}
		if giveUp {
			return false
		}
		return sleep(ctx, c.cfg.Retry.Backoff(dbFails))
	}

	if c.stalled(p.Topic, p.Partition) {
		dbAttempts = 1
	}
	pos := 0
	for pos < len(recs) {
		if tried && ctx.Err() != nil {
			break // stopping: the rest is left for the next owner
		}
		tried = true

		// A record that is not an idem event, or whose handler gave up:
		// dead-letter it, then move on.
		if decErrs[pos] != nil || (fail.idx == pos && (fail.poison || fail.count >= attempts)) {
			n, cause := fail.count, decErrs[pos]
			if cause == nil {
				cause = fail.err
			} else {
				n = 0
			}
			if err := c.sendDeadLetter(ctx, work, cl, recs[pos], n, cause); err != nil {
				if ctx.Err() != nil {
					// Stopping (the wait for the acknowledgement ends
					// then): not a failure of the dead-letter topic,
					// and not retried; the record is left for the next
					// owner, as after a database failure.
					break
				}
				st.stuck = recs[pos]
				if !transient(err) {
					break
				}
				continue
			}
			st.DeadLettered++
			pos++
			dbFails, dbAttempts = 0, attempts
			fail = failure{idx: -1}
			continue
		}

		end := pos + 1
		if fail.idx == pos {
			// The record that failed: alone, after a pause.
			if !sleep(ctx, c.cfg.Retry.Backoff(fail.count)) {
				break
			}
		} else if pos >= single {
			for end < len(recs) && decErrs[end] == nil && end != fail.idx {
				end++
			}
		}
		res, err := c.processBounded(work, evs[pos:end])
		if err == nil {
			st.Applied += res.Applied
			st.Duplicates += res.Duplicates
			if fail.idx == pos {
				fail = failure{idx: -1}
			}
			pos = end
			dbFails, dbAttempts = 0, attempts
			if c.dbLog.Open() {
				c.dbRecovered(ctx)
			}
			continue
		}

		var (
			ee *inbox.EventError
			be *inbox.BulkError
			i  = -1 // the record the handler failed on
			// at is the record a database failure is on: the one
			// the handler's database fault named, else the first.
			at = recs[pos]
		)
		// oneAtATime: one of several records is at fault, but which one
		// is not known; nothing of [pos, end) is applied. The next rounds
		// apply them one at a time, so the one at fault fails alone.
		oneAtATime := func(msg string) {
			st.Failures++
			st.Err = err
			dbFails = 0
			single = end
			c.cfg.Logger.Warn(msg, "topic", p.Topic, "partition", p.Partition, "offset", recs[pos].Offset, "records", end-pos, "err", err)
		}
		if c.cfg.BatchHandler != nil && errors.As(err, &be) {
			if end-pos > 1 && (errors.Is(err, ErrPoison) || !dbFault(err)) {
				oneAtATime("idemkafka: batch handler failed; applying its records one at a time")
				continue
			}
			// One record, or the database's passing failure (a deadlock,
			// a lost connection): says nothing of the records, so the
			// batch is retried whole, below.
			i = pos
		} else if errors.As(err, &ee) {
			i = pos + ee.Index
		} else if refusedAtCommit(err) {
			// The COMMIT refused what the handler wrote (a deferred
			// constraint, or PostgreSQL's transaction aborted by a
			// statement whose error a handler ignored): the records'
			// fault, not the database's, so retrying the batch would
			// fail for ever.
			if end-pos > 1 {
				oneAtATime("idemkafka: commit refused (a deferred constraint, or a handler ignored a failed statement); applying the batch's records one at a time")
				continue
			}
			i = pos
		}
		if i >= 0 && !errors.Is(err, ErrPoison) && dbFault(err) {
			// The handler's database failed, not the record: a
			// deadlock, a lock or statement timeout, a lost
			// connection, idem's tables missing. Retried as a
			// database failure, never dead-lettered.
			at = recs[i]
			i = -1
		}
		if i < 0 && ctx.Err() != nil {
			// Stopping (a Begin that waited is cancelled then): not
			// retried; the records are left for the next owner.
			break
		}
		if i < 0 {
			st.stuck = at
			// The database failed: nothing of [pos, end) is applied
			// (or, after a failed COMMIT, maybe all of it: a redelivery
			// is skipped then). Retry the same records.
			if !transient(err) {
				break
			}
			continue
		}
		// The handler failed on record i: nothing of [pos, end) is
		// applied. The next round applies [pos, i) in a transaction of
		// its own, then tries i alone.
		st.Failures++
		st.Err = err
		dbFails = 0
		if fail.idx == i {
			fail.count++
		} else {
			fail = failure{idx: i, count: 1}
		}
		fail.err = err
		fail.poison = errors.Is(err, ErrPoison) || errors.Is(err, inbox.ErrNilEventID)
		if fail.poison {
			// Dead-lettered next, without the remaining tries: no
			// try count, which would announce a retry.
			c.cfg.Logger.Warn("idemkafka: handler failed; poison, dead-lettering (not retried)",
				"topic", p.Topic, "partition", p.Partition, "offset", recs[i].Offset,
				"event_id", evs[i].ID, "err", err)
		} else {
			c.cfg.Logger.Warn("idemkafka: handler failed",
				"topic", p.Topic, "partition", p.Partition, "offset", recs[i].Offset,
				"event_id", evs[i].ID, "try", fail.count, "of", attempts, "err", err)
		}
	}
	return pos, st
}

// dbRecovered records a transaction that went through the database while
// its failures are tracked (c.dbLog), and logs their end once none came
// for flaplog.Quiet.
func (c *Consumer[TTx]) dbRecovered(ctx context.Context) {
	if a, ep := c.dbLog.Succeeded(time.Now()); a == flaplog.End {
		c.cfg.Logger.InfoContext(ctx, "idemkafka: batches succeed again after database failures; none failed for "+flaplog.Quiet.String(),
			"failures", ep.Failures, "ok_batches", ep.Successes, "since", ep.First, "last_failure", ep.Last)
	}
}

// processBounded is process within TxTimeout. A failure of a transaction
// that outlasted it says so (txTimeoutError).
func (c *Consumer[TTx]) processBounded(work context.Context, evs []inbox.Event) (inbox.BatchResult, error) {
	tctx, cancel := context.WithTimeout(work, c.cfg.TxTimeout)
	defer cancel()
	res, err := c.process(tctx, evs)
	if err != nil && errors.Is(tctx.Err(), context.DeadlineExceeded) && work.Err() == nil {
		err = &txTimeoutError{timeout: c.cfg.TxTimeout, err: err}
	}
	return res, err
}

// txTimeoutError is the failure of a consumer's transaction that did not
// end within ConsumerConfig.TxTimeout. It is a database failure (retried,
// never dead-lettered: dbFault) unless err is a handler's HTTP call's
// (*url.Error).
type txTimeoutError struct {
	timeout time.Duration
	err     error
}

func (e *txTimeoutError) Error() string {
	return fmt.Sprintf("idemkafka: the transaction did not end within ConsumerConfig.TxTimeout (%s): "+
		"the database does not answer, or the handler is too slow: %v", e.timeout, e.err)
}

// Unwrap returns the transaction's error.
func (e *txTimeoutError) Unwrap() error { return e.err }

// process applies evs, new events only, in a transaction of its own, with
// Handler or BatchHandler.
func (c *Consumer[TTx]) process(ctx context.Context, evs []inbox.Event) (inbox.BatchResult, error) {
	if c.cfg.BatchHandler != nil {
		return c.in.ProcessBulk(ctx, evs, c.applyBulk)
	}
	return c.in.ProcessBatch(ctx, evs, c.apply)
}

// applyBulk runs the batch handler on new events. A panic is turned into
// an error, as in apply.
func (c *Consumer[TTx]) applyBulk(ctx context.Context, tx TTx, fresh []inbox.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Logger.Error("idemkafka: batch handler panicked", "events", len(fresh), "first_event_id", fresh[0].ID, "panic", p, "stack", string(debug.Stack()))
			err = panicError(p)
		}
	}()
	envs := make([]event.Envelope, len(fresh))
	for i, e := range fresh {
		envs[i] = *e.Payload.(*event.Envelope)
	}
	return c.cfg.BatchHandler(ctx, tx, envs)
}

// apply runs the handler on a new event. A panic is turned into an error,
// so the record is retried and dead-lettered like any failing record
// instead of crashing the process on every redelivery.
func (c *Consumer[TTx]) apply(ctx context.Context, tx TTx, e inbox.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Logger.Error("idemkafka: handler panicked", "event_id", e.ID, "panic", p, "stack", string(debug.Stack()))
			err = panicError(p)
		}
	}()
	return c.cfg.Handler(ctx, tx, *e.Payload.(*event.Envelope))
}

// panicError is the error of a handler that panicked with p. An error value
// stays in the chain, so a panic with an error wrapping ErrPoison is poison
// as if the handler had returned it.
func panicError(p any) error {
	if err, ok := p.(error); ok {
		return fmt.Errorf("idemkafka: handler panicked: %w", err)
	}
	return fmt.Errorf("idemkafka: handler panicked: %v", p)
}

// sleep waits a jittered d (so that replicas that failed together do not
// retry together) or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	return backoff.Sleep(ctx, backoff.Jitter(d), nil)
}

// refusedAtCommit reports whether err, an inbox error that names no
// event, is a constraint violation (PostgreSQL's SQLSTATE class 23,
// SQLite's SQLITE_CONSTRAINT): the handlers' statements all succeeded, so
// it comes from the COMMIT, which checks deferred constraints (a foreign
// key or a constraint trigger declared DEFERRABLE INITIALLY DEFERRED).
// The database answered: nothing of the transaction is committed, and
// committing the same effects again fails the same way.
//
// It is also a COMMIT that PostgreSQL answered with ROLLBACK: a handler
// ran a statement that failed, ignored the error and returned nil, which
// aborted the transaction (pgdriver and pgsqldriver report it wrapping
// driver.ErrTxAborted). Not SQLite's transaction rolled back by SQLite
// itself (sqlitedriver's driver.ErrTxAborted with SQLite's error code): a
// full disk, an I/O error, a database's failure.
func refusedAtCommit(err error) bool {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return strings.HasPrefix(st.SQLState(), "23")
	}
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		return coded.Code()&0xff == 19 // SQLITE_CONSTRAINT
	}
	return errors.Is(err, driver.ErrTxAborted)
}

// dbFault reports whether err, returned by a handler, is the database's
// fault rather than the record's (dberr.Fault):
//   - a passing failure (dberr.Transient): PostgreSQL's serialization
//     failure, deadlock, lock and statement timeouts, shutdown, a session
//     ended by the server's idle_in_transaction_session_timeout (or
//     transaction_timeout, idle_session_timeout), connection classes, a
//     database that refuses writes (read_only_sql_transaction: a hot
//     standby after a failover, default_transaction_read_only), the
//     server's resources (a full disk, out of memory, too many
//     connections, a configuration limit) and system errors (an I/O
//     error), by SQLSTATE as pgx, pgconn and lib/pq report it; SQLite's
//     BUSY and LOCKED, and its file full, read-only or failing;
//     driver.ErrLockTimeout; a lost or failing database connection
//     (pgconn's errors that are safe to retry or timeouts, *net.OpError,
//     io.ErrUnexpectedEOF, database/sql's driver.ErrBadConn and
//     sql.ErrConnDone);
//   - idem's tables missing (driver.ErrNotMigrated, from the handler's
//     outbox.EnqueueTx on a database not migrated);
//   - PostgreSQL refusing the role a privilege (42501: a GRANT revoked) or
//     a login (class 28: a password rotated, a role set NOLOGIN;
//     dberr.Misconfigured), or a SQLite file corrupt or denied.
//
// A transaction that outlasted ConsumerConfig.TxTimeout (txTimeoutError) is
// one too, unless its error is a handler's HTTP call's.
//
// No record can fix these: they are retried and never dead-lettered
// (dead-lettering every record meanwhile would empty the topic into its
// dead-letter topic). Any other error, an HTTP client's (*url.Error) among
// them even when it wraps a network error, is the record's: it counts
// toward Retry.Attempts and is dead-lettered in the end, so that one
// record whose call fails for good never stalls its partition. A handler
// whose row-level security policy refuses a record (also 42501) wraps the
// error in ErrPoison to dead-letter it.
func dbFault(err error) bool {
	var te *txTimeoutError
	var ue *url.Error
	return dberr.Fault(err) || (errors.As(err, &te) && !errors.As(err, &ue))
}
