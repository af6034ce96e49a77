package pgdriver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

func scanSaga(row pgx.Row) (*driver.Saga, error) {
	var (
		s        driver.Saga
		finished *time.Time
	)
	if err := row.Scan(&s.ID, &s.Type, &s.State, &s.Data, &s.CreatedAt, &s.UpdatedAt, &finished); err != nil {
		return nil, err
	}
	if finished != nil {
		s.FinishedAt = *finished
	}
	return &s, nil
}

// finishedAt is the finished_at stored for a saga moving to state at now.
func finishedAt(state string, now time.Time) *time.Time {
	if driver.SagaFinished(state) {
		return &now
	}
	return nil
}

// SagaCreate implements driver.SagaExecutor. A concurrent create of the same
// ID waits on the primary key for the first transaction; the read that
// follows a conflict is a new statement, so under READ COMMITTED it sees the
// row that transaction committed.
func (e *executor) SagaCreate(ctx context.Context, s *driver.Saga) (*driver.Saga, bool, error) {
	if !driver.ValidSagaState(s.State) {
		return nil, false, fmt.Errorf("pgdriver: saga create: unknown state %q", s.State)
	}
	insert := e.d.expand(pgsql.SagaInsertSQL)
	// A saga deleted between the insert and the read (the cleaner) makes
	// us try again; a few rounds always settle it.
	for range 5 {
		stored, err := scanSaga(e.db.QueryRow(ctx, insert,
			s.ID, s.Type, s.State, s.Data, s.CreatedAt, s.UpdatedAt, finishedAt(s.State, s.UpdatedAt)))
		if err == nil {
			return stored, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, false, mapErr("saga create", err)
		}
		stored, err = e.SagaGet(ctx, &driver.SagaGetParams{SagaID: s.ID})
		if errors.Is(err, driver.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		return stored, false, nil
	}
	return nil, false, fmt.Errorf("pgdriver: saga create %q: saga keeps disappearing", s.ID)
}

// SagaGet implements driver.SagaExecutor.
func (e *executor) SagaGet(ctx context.Context, p *driver.SagaGetParams) (*driver.Saga, error) {
	sagaID := p.SagaID
	s, err := scanSaga(e.db.QueryRow(ctx, e.d.expand(pgsql.SagaGetSQL), sagaID))
	if err != nil {
		return nil, mapErr("saga get", err)
	}
	return s, nil
}

// SagaSetState implements driver.SagaExecutor. The UPDATE waits for the
// share locks SagaStepRecord holds on the saga's row, so a step still being
// recorded under the old state commits before the state changes; READ
// COMMITTED then re-checks the guard against the newest row version.
func (e *executor) SagaSetState(ctx context.Context, p *driver.SagaSetStateParams) (bool, string, error) {
	sagaID, from, to, now := p.SagaID, p.From, p.To, p.Now
	if !driver.ValidSagaState(to) {
		return false, "", fmt.Errorf("pgdriver: saga set state: unknown state %q", to)
	}
	var state string
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.SagaSetStateSQL), sagaID, from, to, now, finishedAt(to, now)).Scan(&state)
	if err == nil {
		return true, state, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, "", mapErr("saga set state", err)
	}
	err = e.db.QueryRow(ctx, e.d.expand(pgsql.SagaStateSQL), sagaID).Scan(&state)
	if err != nil {
		return false, "", mapErr("saga set state", err)
	}
	return false, state, nil
}

// SagaStepRecord implements driver.SagaExecutor in one statement
// (pgsql.SagaStepInsertSQL): the step row is selected from the saga's row
// when the saga is, as last committed, in the state the kind requires, and
// inserted unless the step exists; then, only if it was inserted, the
// saga's row is locked FOR SHARE (so SagaSetState waits for this
// transaction) and its state read again. A concurrent uncommitted insert of
// the same step makes the INSERT wait on the primary key, holding no lock
// on the saga's row, so the transaction it waits for may still change the
// saga's state; afterwards the step is skipped (that transaction
// committed) or inserted here (it rolled back). A step inserted while a
// state change committed is undone (rolled back to the savepoint, or
// deleted) and refused. Only when nothing was inserted does a second
// statement read why: the existing step, or the saga's state.
//
// With p.Savepoint, SAVEPOINT travels with the INSERT in one round trip,
// and, when nothing was inserted, RELEASE with the read.
func (e *executor) SagaStepRecord(ctx context.Context, p *driver.SagaStepRecordParams) (bool, []byte, error) {
	sagaID, step, kind, result, now := p.SagaID, p.Step, p.Kind, p.Result, p.Now
	want, ok := driver.SagaStepState(kind)
	if !ok {
		return false, nil, fmt.Errorf("pgdriver: saga step record: unknown kind %q", kind)
	}
	var state string
	insert := e.d.expand(pgsql.SagaStepInsertSQL)
	var err error
	if p.Savepoint {
		err = e.batch(ctx, pgsql.SagaSavepointSQL, func(b *pgx.Batch) {
			b.Queue(insert, sagaID, step, kind, result, now, want).QueryRow(func(row pgx.Row) error { return row.Scan(&state) })
		})
	} else {
		err = e.db.QueryRow(ctx, insert, sagaID, step, kind, result, now, want).Scan(&state)
	}
	if err == nil {
		if state == want {
			return true, nil, nil
		}
		// The saga's state changed between the INSERT's snapshot and the
		// lock: undo the step.
		if p.Savepoint {
			_, err = e.db.Exec(ctx, pgsql.SagaRollbackSavepointSQL+"; "+pgsql.SagaReleaseSQL)
		} else {
			_, err = e.db.Exec(ctx, e.d.expand(pgsql.SagaStepDeleteSQL), sagaID, step)
		}
		if err != nil {
			return false, nil, mapErr("saga step record", err)
		}
		return false, nil, &driver.SagaStateError{SagaID: sagaID, State: state, Want: []string{want}}
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, nil, mapErr("saga step record", err)
	}
	var (
		recorded bool
		existing []byte
	)
	read := e.d.expand(pgsql.SagaStepReadSQL)
	if p.Savepoint {
		err = e.batch(ctx, pgsql.SagaReleaseSQL, func(b *pgx.Batch) {
			b.Queue(read, sagaID, step).QueryRow(func(row pgx.Row) error { return row.Scan(&state, &recorded, &existing) })
		})
	} else {
		err = e.db.QueryRow(ctx, read, sagaID, step).Scan(&state, &recorded, &existing)
	}
	if err != nil {
		return false, nil, mapErr("saga step record", err)
	}
	if recorded {
		return false, existing, nil
	}
	return false, nil, &driver.SagaStateError{SagaID: sagaID, State: state, Want: []string{want}}
}

// SagaStepSetResult implements driver.SagaExecutor.
func (e *executor) SagaStepSetResult(ctx context.Context, p *driver.SagaStepSetResultParams) error {
	sagaID, step, result := p.SagaID, p.Step, p.Result
	tag, err := e.db.Exec(ctx, e.d.expand(pgsql.SagaStepSetResultSQL), sagaID, step, result)
	if err != nil {
		return mapErr("saga step set result", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: saga step set result %q/%q: %w", sagaID, step, driver.ErrNotFound)
	}
	return nil
}

// SagaStepEnd implements driver.SagaExecutor: ROLLBACK TO and RELEASE, or
// the result's UPDATE and RELEASE, in one round trip.
func (e *executor) SagaStepEnd(ctx context.Context, p *driver.SagaStepEndParams) error {
	if p.Failed {
		if _, err := e.db.Exec(ctx, pgsql.SagaRollbackSavepointSQL+"; "+pgsql.SagaReleaseSQL); err != nil {
			return mapErr("saga step rollback", err)
		}
		return nil
	}
	if p.Result == nil {
		if _, err := e.db.Exec(ctx, pgsql.SagaReleaseSQL); err != nil {
			return mapErr("saga step release", err)
		}
		return nil
	}
	var tag pgconn.CommandTag
	err := e.batch(ctx, "", func(b *pgx.Batch) {
		b.Queue(e.d.expand(pgsql.SagaStepSetResultSQL), p.SagaID, p.Step, p.Result).Exec(func(ct pgconn.CommandTag) error {
			tag = ct
			return nil
		})
		b.Queue(pgsql.SagaReleaseSQL)
	})
	if err != nil {
		return mapErr("saga step set result", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgdriver: saga step set result %q/%q: %w", p.SagaID, p.Step, driver.ErrNotFound)
	}
	return nil
}

// batch sends first (unless empty) and the statements queue adds in one
// round trip, and returns the first error.
func (e *executor) batch(ctx context.Context, first string, queue func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	if first != "" {
		b.Queue(first)
	}
	queue(b)
	return e.db.SendBatch(ctx, b).Close()
}

// SagaSteps implements driver.SagaExecutor.
func (e *executor) SagaSteps(ctx context.Context, p *driver.SagaStepsParams) ([]driver.SagaStep, error) {
	sagaID := p.SagaID
	rows, err := e.db.Query(ctx, e.d.expand(pgsql.SagaStepsSQL), sagaID)
	if err != nil {
		return nil, mapErr("saga steps", err)
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (driver.SagaStep, error) {
		var s driver.SagaStep
		err := row.Scan(&s.SagaID, &s.Name, &s.Kind, &s.Seq, &s.Result, &s.CompletedAt)
		return s, err
	})
	if err != nil {
		return nil, mapErr("saga steps", err)
	}
	return steps, nil
}

// SagaList implements driver.SagaExecutor.
func (e *executor) SagaList(ctx context.Context, p *driver.SagaListParams) ([]driver.Saga, error) {
	states, limit := p.States, p.Limit
	if limit <= 0 {
		return nil, fmt.Errorf("pgdriver: saga list: limit %d must be positive", limit)
	}
	if len(states) == 0 {
		return nil, nil
	}
	q, args := pgsql.SagaListQuery(states, false), []any{slices.Clone(states), limit}
	if p.AfterID != "" {
		q, args = pgsql.SagaListQuery(states, true), append(args, p.AfterUpdatedAt, p.AfterID)
	}
	rows, err := e.db.Query(ctx, e.d.expand(q), args...)
	if err != nil {
		return nil, mapErr("saga list", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (driver.Saga, error) {
		s, err := scanSaga(row)
		if err != nil {
			return driver.Saga{}, err
		}
		return *s, nil
	})
	if err != nil {
		return nil, mapErr("saga list", err)
	}
	return out, nil
}

// SagaDeleteFinishedBefore implements driver.SagaExecutor. Like
// RecordDeleteExpired, it deletes sagas after p.After by ctid from bounded
// subqueries (see pgsql.SagaDeleteFinishedBeforeSQL), and skips sagas a
// concurrent cleaner holds. Their steps go with them (ON DELETE CASCADE).
func (e *executor) SagaDeleteFinishedBefore(ctx context.Context, p *driver.SagaDeleteFinishedBeforeParams) (driver.DeleteResult[driver.SagaCursor], error) {
	res := driver.DeleteResult[driver.SagaCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgdriver: saga delete: limit %d must be positive", p.Limit)
	}
	args := []any{p.Before, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.FinishedAt, p.After.SagaID)
	}
	var last driver.SagaCursor
	var n int
	err := e.db.QueryRow(ctx, e.d.expand(pgsql.SagaDeleteFinishedBeforeSQL.Pick(!p.After.IsZero())), args...).
		Scan(&n, &last.FinishedAt, &last.SagaID)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, nil
	}
	if err != nil {
		return res, mapErr("saga delete", err)
	}
	return driver.DeleteResult[driver.SagaCursor]{Deleted: n, Last: last}, nil
}
