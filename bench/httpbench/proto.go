package main

// This file is a PROTOTYPE of a change to pgdriver, kept in the benchmark so
// that its effect can be measured side by side with the real driver. It is
// not part of the library, and it does not change idemhttp.
//
// Stock pgdriver, ModeTx, round trips (| separates them):
//
//	first execution  BEGIN | set_config+claim INSERT+SET LOCAL | handler INSERT | record UPDATE | COMMIT   (5, 1 fsync)
//	replay           BEGIN | set_config+claim INSERT+SET LOCAL | SELECT record | ROLLBACK                  (4)
//	bare handler     BEGIN | INSERT | COMMIT                                                                 (3, 1 fsync)
//
// Four independent changes, selected with -proto (a comma list):
//
//	begin   Begin only acquires a connection; BEGIN travels in the pipeline
//	        of the transaction's first statement (the claim, in ModeTx).
//	read    The claim pipeline also SELECTs the record, so a key that is
//	        not ours comes back without a second round trip. A separate
//	        statement, so in READ COMMITTED it sees the commit of a
//	        concurrent owner the INSERT waited for.
//	commit  RecordComplete only remembers the outcome; Commit sends the
//	        record UPDATE and COMMIT in one pipeline. The UPDATE fails (not
//	        merely matches no row) when the lease is not ours, and
//	        PostgreSQL then skips COMMIT up to the pipeline's Sync, so a lost
//	        lease can never commit the effect without its record.
//	peek    (needs begin) The claim pipeline starts, before BEGIN, with a
//	        read of a live completed record and a guard statement that
//	        fails when there is one: the failure makes PostgreSQL skip
//	        BEGIN and the claim, so a replay costs one round trip, opens no
//	        transaction, takes no row lock and needs no ROLLBACK. The
//	        statements are prepared by name on each connection, because pgx
//	        drops its cached statements of a batch that failed.
//
// With all four ("all"): first execution 3 round trips (as the bare
// handler), replay 1, and the same guarantees as stock pgdriver.
//
//	single  (a different design; implies begin, commit, peek) The claim
//	        writes nothing: it peeks for a completed record and begins.
//	        The record is INSERTed once, completed, in COMMIT's pipeline:
//	        one record write instead of INSERT then UPDATE. Concurrent
//	        duplicates all run the handler; the unique index makes every
//	        one but the first wait at commit and fail, which rolls back its
//	        whole transaction, effect included: still one effect per key.
//	        The losers answer 503 outcome-unknown here, because idemhttp
//	        does not expect a claim that can be lost at commit; a real
//	        implementation would replay the winner's record. Only for
//	        handlers whose effects are all in the transaction (ModeTx's
//	        premise), and the losers' work is wasted.
//
// What a real implementation must settle: with "commit", a lost lease
// (impossible in ModeTx: the transaction holds the claimed row) surfaces
// from Commit, so idemhttp would answer 503 outcome-unknown instead of 503
// store-unavailable, both rolled back; "peek" fails on purpose with a cast
// error, a real one would RAISE a dedicated SQLSTATE from a function
// created by a migration; the lazy transaction supports neither nested
// Begin nor LargeObjects.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
)

// protoFeatures are the prototype's changes, in the order they build on
// each other.
var protoFeatures = []string{"begin", "read", "commit", "peek", "single"}

// parseProto parses the -proto flag.
func parseProto(s string) (map[string]bool, error) {
	fs := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "" || f == "none":
		case f == "all": // the four that keep stock semantics
			for _, g := range protoFeatures[:4] {
				fs[g] = true
			}
		case slices.Contains(protoFeatures, f):
			fs[f] = true
		default:
			return nil, fmt.Errorf("-proto: unknown feature %q (want a comma list of %s, all or none)", f, strings.Join(protoFeatures, ","))
		}
	}
	if fs["single"] { // built on them
		fs["begin"], fs["commit"], fs["peek"] = true, true, true
	}
	if fs["peek"] && !fs["begin"] {
		return nil, errors.New("-proto: peek needs begin (it must run before BEGIN)")
	}
	return fs, nil
}

// protoLabel lists the features in order.
func protoLabel(fs map[string]bool) string {
	var on []string
	for _, f := range protoFeatures {
		if fs[f] {
			on = append(on, f)
		}
	}
	return strings.Join(on, "+")
}

// Names of the statements the prototype prepares on every connection.
const (
	stmtPeek      = "idembench_peek"
	stmtGuard     = "idembench_guard"
	stmtBegin     = "idembench_begin"
	stmtLock      = "idembench_lock_timeout"
	stmtClaim     = "idembench_claim"
	stmtUnlock    = "idembench_lock_default"
	stmtGet       = "idembench_get"
	guardSentinel = "idem-replay"
)

// pipeDriver is pgdriver with the transaction-bound path pipelined.
type pipeDriver struct {
	*pgdriver.Driver
	pool        *pgxpool.Pool
	features    map[string]bool
	stmts       map[string]string // prepared by name on each connection
	completeSQL string
	insertSQL   string // "single": the record, written once, at commit
}

var _ driver.Driver[pgx.Tx] = (*pipeDriver)(nil)

const recordCols = `scope, idempotency_key, fingerprint, state, http_status, headers, body,
	lease_token, lease_expires_at, created_at, expires_at`

func newPipeDriver(d *pgdriver.Driver, features map[string]bool) *pipeDriver {
	t := d.Table("idempotency_record")
	return &pipeDriver{
		Driver:   d,
		pool:     d.Pool(),
		features: features,
		stmts: map[string]string{
			stmtPeek: `SELECT ` + recordCols + ` FROM ` + t + `
				WHERE scope = $1 AND idempotency_key = $2 AND state = 'completed' AND expires_at > $3`,
			// Fails when the peek's record exists; depends on count(*) so
			// the planner cannot fold it into a constant error.
			stmtGuard: `SELECT (CASE WHEN count(*) = 0 THEN '0' ELSE '` + guardSentinel + `' END)::int FROM ` + t + `
				WHERE scope = $1 AND idempotency_key = $2 AND state = 'completed' AND expires_at > $3`,
			stmtBegin: `begin`,
			stmtLock:  `SELECT set_config('lock_timeout', $1, true)`,
			// The claim of pgdriver's record.go, unchanged.
			stmtClaim: `INSERT INTO ` + t + ` AS r
		(scope, idempotency_key, fingerprint, state, lease_token, lease_expires_at, created_at, expires_at)
		VALUES ($1, $2, $3, 'in_progress', $4, $5, $6, $7)
		ON CONFLICT (scope, idempotency_key) DO UPDATE SET
			fingerprint = EXCLUDED.fingerprint, state = 'in_progress',
			http_status = NULL, headers = NULL, body = NULL,
			lease_token = EXCLUDED.lease_token, lease_expires_at = EXCLUDED.lease_expires_at,
			created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
		WHERE r.expires_at <= $6
		   OR (r.state = 'in_progress' AND r.lease_expires_at <= $6 AND r.fingerprint = EXCLUDED.fingerprint)
		RETURNING true`,
			stmtUnlock: `SET LOCAL lock_timeout TO DEFAULT`,
			// The record, unless the claim just made it ours.
			stmtGet: `SELECT ` + recordCols + ` FROM ` + t + `
				WHERE scope = $1 AND idempotency_key = $2 AND lease_token IS DISTINCT FROM $3`,
		},
		// Fails with a cast error (so COMMIT, queued behind it, is
		// skipped) when no row matched.
		completeSQL: `WITH u AS (UPDATE ` + t + `
			SET state = 'completed', http_status = $4, headers = $5, body = $6,
			    lease_token = NULL, lease_expires_at = NULL
			WHERE scope = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'
			RETURNING 1)
		SELECT (CASE WHEN count(*) = 1 THEN '1' ELSE 'idem: lease lost, rows=' || count(*) END)::int FROM u`,
		// Waits on the unique index for a concurrent duplicate's
		// uncommitted record; fails (COMMIT skipped) if that one
		// committed, or if a live record exists.
		insertSQL: `WITH i AS (INSERT INTO ` + t + ` AS r
			(scope, idempotency_key, fingerprint, state, http_status, headers, body, created_at, expires_at)
			VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8)
			ON CONFLICT (scope, idempotency_key) DO UPDATE SET
				fingerprint = EXCLUDED.fingerprint, state = 'completed',
				http_status = EXCLUDED.http_status, headers = EXCLUDED.headers, body = EXCLUDED.body,
				lease_token = NULL, lease_expires_at = NULL,
				created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
			WHERE r.expires_at <= EXCLUDED.created_at
			RETURNING 1)
		SELECT (CASE WHEN count(*) = 1 THEN '1' ELSE 'idem: key taken, rows=' || count(*) END)::int FROM i`,
	}
}

// Begin implements driver.Driver. With "begin" it only acquires a
// connection; BEGIN leaves with the first statement.
func (d *pipeDriver) Begin(ctx context.Context) (pgx.Tx, error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pipedriver: begin: %w", err)
	}
	t := &lazyTx{conn: c}
	if err := d.prepare(ctx, c.Conn()); err != nil {
		t.release(ctx)
		return nil, fmt.Errorf("pipedriver: prepare: %w", err)
	}
	if !d.features["begin"] {
		if err := t.begin(ctx); err != nil {
			t.release(ctx)
			return nil, fmt.Errorf("pipedriver: begin: %w", err)
		}
	}
	return t, nil
}

// prepare prepares the named statements on c; pgx answers from its own
// table, without a round trip, once they are.
func (d *pipeDriver) prepare(ctx context.Context, c *pgx.Conn) error {
	for name, sql := range d.stmts {
		if _, err := c.Prepare(ctx, name, sql); err != nil {
			return err
		}
	}
	return nil
}

// Commit implements driver.Driver.
func (d *pipeDriver) Commit(ctx context.Context, tx pgx.Tx) error {
	lt, ok := tx.(*lazyTx)
	if !ok {
		return d.Driver.Commit(ctx, tx)
	}
	if err := lt.commit(ctx, d); err != nil {
		return fmt.Errorf("pipedriver: commit: %w", err)
	}
	return nil
}

// Rollback implements driver.Driver.
func (d *pipeDriver) Rollback(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pipedriver: rollback: %w", err)
	}
	return nil
}

// UnwrapExecutor implements driver.Driver.
func (d *pipeDriver) UnwrapExecutor(tx pgx.Tx) driver.Executor {
	lt, ok := tx.(*lazyTx)
	if !ok {
		return d.Driver.UnwrapExecutor(tx)
	}
	return &pipeExecutor{Executor: d.Driver.UnwrapExecutor(lt), d: d, tx: lt}
}

// pipeExecutor overrides the claim and the completion; the rest is
// pgdriver's, running on the lazy transaction.
type pipeExecutor struct {
	driver.Executor
	d  *pipeDriver
	tx *lazyTx
}

// RecordClaim implements driver.RecordExecutor.
func (e *pipeExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	fs := e.d.features
	if !fs["read"] && !fs["peek"] {
		return e.Executor.RecordClaim(ctx, p) // pgdriver's, BEGIN riding on its batch
	}
	t := e.tx
	if t.conn == nil {
		return nil, pgx.ErrTxClosed
	}
	if fs["single"] {
		return e.claimSingle(ctx, p)
	}
	for range 5 {
		var (
			peeked, rec *driver.Record
			claimed     bool
		)
		b := &pgx.Batch{}
		if fs["peek"] && !t.begun {
			b.Queue(stmtPeek, p.Scope, p.Key, p.Now).QueryRow(func(row pgx.Row) error {
				r, err := scanRecord(row)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				peeked = r
				return err
			})
			b.Queue(stmtGuard, p.Scope, p.Key, p.Now)
		}
		if !t.begun {
			b.Queue(stmtBegin)
		}
		if p.LockTimeout > 0 {
			b.Queue(stmtLock, fmt.Sprintf("%dms", max(p.LockTimeout.Milliseconds(), 1)))
		}
		b.Queue(stmtClaim, p.Scope, p.Key, p.Fingerprint, p.LeaseToken, p.LeaseExpiresAt, p.Now, p.ExpiresAt).
			QueryRow(func(row pgx.Row) error {
				err := row.Scan(&claimed)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
		if p.LockTimeout > 0 {
			b.Queue(stmtUnlock)
		}
		b.Queue(stmtGet, p.Scope, p.Key, p.LeaseToken).QueryRow(func(row pgx.Row) error {
			r, err := scanRecord(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			rec = r
			return err
		})
		err := t.conn.SendBatch(ctx, b).Close()
		t.begun = t.conn.Conn().PgConn().TxStatus() != 'I'
		if err != nil {
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, guardSentinel):
				if peeked != nil {
					return &driver.RecordClaimResult{Existing: peeked}, nil
				}
				continue // completed between the peek and the guard: look again
			case errors.As(err, &pgErr) && pgErr.Code == "55P03":
				return nil, fmt.Errorf("pipedriver: claim: %w: %w", driver.ErrLockTimeout, err)
			}
			return nil, fmt.Errorf("pipedriver: claim: %w", err)
		}
		if claimed {
			return &driver.RecordClaimResult{Claimed: true}, nil
		}
		if rec != nil {
			return &driver.RecordClaimResult{Existing: rec}, nil
		}
		// Released by its owner between the claim and the read: again.
	}
	return nil, fmt.Errorf("pipedriver: claim %q: record keeps disappearing", p.Key)
}

// claimSingle is the "single" claim: no record is written now. It peeks for
// a live completed record and otherwise begins the transaction; the record
// is inserted, completed, at commit. A concurrent duplicate runs its
// handler too, then waits on the unique index at commit and fails there:
// its whole transaction, effect included, rolls back. (idemhttp answers
// that 503 outcome-unknown; a real implementation would replay the
// winner's record instead.)
func (e *pipeExecutor) claimSingle(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	t := e.tx
	if t.begun {
		return nil, errors.New("pipedriver: single claim must be the transaction's first statement")
	}
	for range 5 {
		var peeked *driver.Record
		b := &pgx.Batch{}
		b.Queue(stmtPeek, p.Scope, p.Key, p.Now).QueryRow(func(row pgx.Row) error {
			r, err := scanRecord(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			peeked = r
			return err
		})
		b.Queue(stmtGuard, p.Scope, p.Key, p.Now)
		b.Queue(stmtBegin)
		err := t.conn.SendBatch(ctx, b).Close()
		t.begun = t.conn.Conn().PgConn().TxStatus() != 'I'
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			cp := *p
			t.claim = &cp
			return &driver.RecordClaimResult{Claimed: true}, nil
		case errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, guardSentinel):
			if peeked != nil {
				return &driver.RecordClaimResult{Existing: peeked}, nil
			}
		default:
			return nil, fmt.Errorf("pipedriver: claim: %w", err)
		}
	}
	return nil, fmt.Errorf("pipedriver: claim %q: record keeps changing", p.Key)
}

// RecordComplete implements driver.RecordExecutor. With "commit" it only
// remembers the outcome, for Commit to store.
func (e *pipeExecutor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	if !e.d.features["commit"] {
		return e.Executor.RecordComplete(ctx, p)
	}
	if e.tx.pending != nil {
		return errors.New("pipedriver: complete: outcome already pending")
	}
	cp := *p
	e.tx.pending = &cp
	return nil
}

func scanRecord(row pgx.Row) (*driver.Record, error) {
	var (
		r          driver.Record
		status     *int32
		leaseToken *string
		leaseUntil *time.Time
	)
	err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.State, &status, &r.Headers, &r.Body,
		&leaseToken, &leaseUntil, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return nil, err
	}
	if status != nil {
		r.Status = int(*status)
	}
	if leaseToken != nil {
		r.LeaseToken = *leaseToken
	}
	if leaseUntil != nil {
		r.LeaseExpiresAt = *leaseUntil
	}
	return &r, nil
}
