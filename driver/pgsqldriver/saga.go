package pgsqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/internal/pgsql"
)

func scanSaga(row scanner) (driver.Saga, error) {
	var (
		s        driver.Saga
		finished sql.NullTime
	)
	if err := row.Scan(&s.ID, &s.Type, &s.State, &s.Data, &s.CreatedAt, &s.UpdatedAt, &finished); err != nil {
		return s, err
	}
	s.FinishedAt = nullTime(finished)
	return s, nil
}

// finishedAt is the finished_at stored for a saga moving to state at now.
func finishedAt(state string, now time.Time) sql.NullTime {
	return sql.NullTime{Time: now, Valid: driver.SagaFinished(state)}
}

// SagaCreate implements driver.SagaExecutor (see pgdriver's SagaCreate).
func (e *executor) SagaCreate(ctx context.Context, s *driver.Saga) (*driver.Saga, bool, error) {
	if !driver.ValidSagaState(s.State) {
		return nil, false, fmt.Errorf("pgsqldriver: saga create: unknown state %q", s.State)
	}
	// A saga deleted between the insert and the read (the cleaner) makes
	// us try again; a few rounds always settle it.
	for range 5 {
		stored, err := scanSaga(e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaInsertSQL),
			s.ID, s.Type, s.State, s.Data, s.CreatedAt, s.UpdatedAt, finishedAt(s.State, s.UpdatedAt)))
		if err == nil {
			return &stored, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return nil, false, mapErr("saga create", err)
		}
		existing, err := e.SagaGet(ctx, &driver.SagaGetParams{SagaID: s.ID})
		if errors.Is(err, driver.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		return existing, false, nil
	}
	return nil, false, fmt.Errorf("pgsqldriver: saga create %q: saga keeps disappearing", s.ID)
}

// SagaGet implements driver.SagaExecutor.
func (e *executor) SagaGet(ctx context.Context, p *driver.SagaGetParams) (*driver.Saga, error) {
	s, err := scanSaga(e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaGetSQL), p.SagaID))
	if err != nil {
		return nil, mapErr("saga get", err)
	}
	return &s, nil
}

// SagaSetState implements driver.SagaExecutor: one UPDATE guarded by the
// expected states, which waits for the share locks SagaStepRecord holds.
func (e *executor) SagaSetState(ctx context.Context, p *driver.SagaSetStateParams) (bool, string, error) {
	if !driver.ValidSagaState(p.To) {
		return false, "", fmt.Errorf("pgsqldriver: saga set state: unknown state %q", p.To)
	}
	var state string
	err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaSetStateSQL),
		p.SagaID, textArray(p.From), p.To, p.Now, finishedAt(p.To, p.Now)).Scan(&state)
	if err == nil {
		return true, state, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, "", mapErr("saga set state", err)
	}
	if err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaStateSQL), p.SagaID).Scan(&state); err != nil {
		return false, "", mapErr("saga set state", err)
	}
	return false, state, nil
}

// SagaStepRecord implements driver.SagaExecutor in one statement (see
// pgsql.SagaStepInsertSQL and pgdriver's): the step is inserted without a
// lock on the saga's row, which is then locked FOR SHARE only if the step
// was inserted; a step inserted while a state change committed is undone
// and refused. Only when nothing was inserted does a second statement read
// why.
func (e *executor) SagaStepRecord(ctx context.Context, p *driver.SagaStepRecordParams) (bool, []byte, error) {
	want, ok := driver.SagaStepState(p.Kind)
	if !ok {
		return false, nil, fmt.Errorf("pgsqldriver: saga step record: unknown kind %q", p.Kind)
	}
	if p.Savepoint {
		if _, err := e.db.ExecContext(ctx, pgsql.SagaSavepointSQL); err != nil {
			return false, nil, mapErr("saga step record", err)
		}
	}
	var state string
	err := e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaStepInsertSQL),
		p.SagaID, p.Step, p.Kind, p.Result, p.Now, want).Scan(&state)
	if err == nil {
		if state == want {
			return true, nil, nil
		}
		// The saga's state changed between the INSERT's snapshot and the
		// lock: undo the step.
		undo := []string{pgsql.SagaRollbackSavepointSQL, pgsql.SagaReleaseSQL}
		var args []any
		if !p.Savepoint {
			undo, args = []string{e.d.expand(pgsql.SagaStepDeleteSQL)}, []any{p.SagaID, p.Step}
		}
		for _, q := range undo {
			if _, err := e.db.ExecContext(ctx, q, args...); err != nil {
				return false, nil, mapErr("saga step record", err)
			}
		}
		return false, nil, &driver.SagaStateError{SagaID: p.SagaID, State: state, Want: []string{want}}
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, nil, mapErr("saga step record", err)
	}
	if p.Savepoint {
		if _, err := e.db.ExecContext(ctx, pgsql.SagaReleaseSQL); err != nil {
			return false, nil, mapErr("saga step record", err)
		}
	}
	var (
		recorded bool
		existing []byte
	)
	err = e.db.QueryRowContext(ctx, e.d.expand(pgsql.SagaStepReadSQL), p.SagaID, p.Step).Scan(&state, &recorded, &existing)
	if err != nil {
		return false, nil, mapErr("saga step record", err)
	}
	if recorded {
		return false, existing, nil
	}
	return false, nil, &driver.SagaStateError{SagaID: p.SagaID, State: state, Want: []string{want}}
}

// SagaStepSetResult implements driver.SagaExecutor.
func (e *executor) SagaStepSetResult(ctx context.Context, p *driver.SagaStepSetResultParams) error {
	res, err := e.db.ExecContext(ctx, e.d.expand(pgsql.SagaStepSetResultSQL), p.SagaID, p.Step, p.Result)
	n, err := rowsAffected("saga step set result", res, err)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("pgsqldriver: saga step set result %q/%q: %w", p.SagaID, p.Step, driver.ErrNotFound)
	}
	return nil
}

// SagaStepEnd implements driver.SagaExecutor, one statement at a time
// (database/sql has no pipeline).
func (e *executor) SagaStepEnd(ctx context.Context, p *driver.SagaStepEndParams) error {
	if p.Failed {
		for _, q := range []string{pgsql.SagaRollbackSavepointSQL, pgsql.SagaReleaseSQL} {
			if _, err := e.db.ExecContext(ctx, q); err != nil {
				return mapErr("saga step rollback", err)
			}
		}
		return nil
	}
	if p.Result != nil {
		if err := e.SagaStepSetResult(ctx, &driver.SagaStepSetResultParams{SagaID: p.SagaID, Step: p.Step, Result: p.Result}); err != nil {
			return err
		}
	}
	if _, err := e.db.ExecContext(ctx, pgsql.SagaReleaseSQL); err != nil {
		return mapErr("saga step release", err)
	}
	return nil
}

// SagaSteps implements driver.SagaExecutor.
func (e *executor) SagaSteps(ctx context.Context, p *driver.SagaStepsParams) ([]driver.SagaStep, error) {
	rows, err := e.db.QueryContext(ctx, e.d.expand(pgsql.SagaStepsSQL), p.SagaID)
	if err != nil {
		return nil, mapErr("saga steps", err)
	}
	steps, err := collect(rows, func(row scanner) (driver.SagaStep, error) {
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
	if p.Limit <= 0 {
		return nil, fmt.Errorf("pgsqldriver: saga list: limit %d must be positive", p.Limit)
	}
	if len(p.States) == 0 {
		return nil, nil
	}
	q, args := pgsql.SagaListQuery(p.States, false), []any{textArray(p.States), p.Limit}
	if p.AfterID != "" {
		q, args = pgsql.SagaListQuery(p.States, true), append(args, p.AfterUpdatedAt, p.AfterID)
	}
	rows, err := e.db.QueryContext(ctx, e.d.expand(q), args...)
	if err != nil {
		return nil, mapErr("saga list", err)
	}
	out, err := collect(rows, scanSaga)
	if err != nil {
		return nil, mapErr("saga list", err)
	}
	return out, nil
}

// SagaDeleteFinishedBefore implements driver.SagaExecutor (see
// pgsql.SagaDeleteFinishedBeforeSQL); the steps go with their sagas (ON
// DELETE CASCADE).
func (e *executor) SagaDeleteFinishedBefore(ctx context.Context, p *driver.SagaDeleteFinishedBeforeParams) (driver.DeleteResult[driver.SagaCursor], error) {
	res := driver.DeleteResult[driver.SagaCursor]{Last: p.After}
	if p.Limit <= 0 {
		return res, fmt.Errorf("pgsqldriver: saga delete: limit %d must be positive", p.Limit)
	}
	args := []any{p.Before, p.Limit}
	if !p.After.IsZero() {
		args = append(args, p.After.FinishedAt, p.After.SagaID)
	}
	var last driver.SagaCursor
	n, err := e.retentionDelete(ctx, "saga delete", pgsql.SagaDeleteFinishedBeforeSQL.Pick(!p.After.IsZero()), args,
		&last.FinishedAt, &last.SagaID)
	if err != nil || n == 0 {
		return res, err
	}
	return driver.DeleteResult[driver.SagaCursor]{Deleted: n, Last: last}, nil
}
