package sqlitedriver

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/driver"
)

const sagaColumns = `saga_id, saga_type, state, data, created_at, updated_at, finished_at`

type scanner interface{ Scan(dest ...any) error }

func scanSaga(row scanner) (*driver.Saga, error) {
	var (
		s                driver.Saga
		created, updated int64
		finished         sql.NullInt64
	)
	if err := row.Scan(&s.ID, &s.Type, &s.State, &s.Data, &created, &updated, &finished); err != nil {
		return nil, err
	}
	s.CreatedAt = fromMicros(created)
	s.UpdatedAt = fromMicros(updated)
	if finished.Valid {
		s.FinishedAt = fromMicros(finished.Int64)
	}
	return &s, nil
}

// finishedAt is the finished_at stored for a saga moving to state at now.
func finishedAt(state string, now time.Time) any {
	if driver.SagaFinished(state) {
		return micros(now)
	}
	return nil
}

// jsonStrings encodes states as a JSON array for json_each.
func jsonStrings(states []string) string {
	if states == nil {
		states = []string{}
	}
	b, _ := json.Marshal(states) // []string always encodes
	return string(b)
}

// SagaCreate implements driver.SagaExecutor. SQLite serialises writers, so
// the read after a conflict sees the committed saga.
func (e *executor) SagaCreate(ctx context.Context, s *driver.Saga) (*driver.Saga, bool, error) {
	if !driver.ValidSagaState(s.State) {
		return nil, false, fmt.Errorf("sqlitedriver: saga create: unknown state %q", s.State)
	}
	stored, err := scanSaga(e.db.QueryRowContext(ctx, e.d.expand(`INSERT INTO {{table}}saga (`+sagaColumns+`)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
		ON CONFLICT (saga_id) DO NOTHING
		RETURNING `+sagaColumns),
		s.ID, s.Type, s.State, s.Data, micros(s.CreatedAt), micros(s.UpdatedAt), finishedAt(s.State, s.UpdatedAt)))
	if err == nil {
		return stored, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, mapErr("saga create", err)
	}
	stored, err = e.SagaGet(ctx, &driver.SagaGetParams{SagaID: s.ID})
	if err != nil {
		return nil, false, err
	}
	return stored, false, nil
}

// SagaGet implements driver.SagaExecutor.
func (e *executor) SagaGet(ctx context.Context, p *driver.SagaGetParams) (*driver.Saga, error) {
	sagaID := p.SagaID
	s, err := scanSaga(e.db.QueryRowContext(ctx, e.d.expand(`SELECT `+sagaColumns+` FROM {{table}}saga WHERE saga_id = ?1`), sagaID))
	if err != nil {
		return nil, mapErr("saga get", err)
	}
	return s, nil
}

// SagaSetState implements driver.SagaExecutor.
func (e *executor) SagaSetState(ctx context.Context, p *driver.SagaSetStateParams) (bool, string, error) {
	sagaID, from, to, now := p.SagaID, p.From, p.To, p.Now
	if !driver.ValidSagaState(to) {
		return false, "", fmt.Errorf("sqlitedriver: saga set state: unknown state %q", to)
	}
	var state string
	err := e.db.QueryRowContext(ctx, e.d.expand(`UPDATE {{table}}saga
		SET state = ?3, updated_at = ?4, finished_at = ?5
		WHERE saga_id = ?1 AND state IN (SELECT value FROM json_each(?2))
		RETURNING state`), sagaID, jsonStrings(from), to, micros(now), finishedAt(to, now)).Scan(&state)
	if err == nil {
		return true, state, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, "", mapErr("saga set state", err)
	}
	err = e.db.QueryRowContext(ctx, e.d.expand(`SELECT state FROM {{table}}saga WHERE saga_id = ?1`), sagaID).Scan(&state)
	if err != nil {
		return false, "", mapErr("saga set state", err)
	}
	return false, state, nil
}

// SagaStepRecord implements driver.SagaExecutor in one statement: the step
// row is selected from the saga's row when the saga is in the state the kind
// requires, numbered after the saga's last step, and inserted unless the
// step exists. SQLite serialises writers, so the numbering is exact and a
// concurrent duplicate waits for the write lock and then finds the committed
// step. Only when nothing was inserted does a second statement read why.
func (e *executor) SagaStepRecord(ctx context.Context, p *driver.SagaStepRecordParams) (bool, []byte, error) {
	sagaID, step, kind, result, now := p.SagaID, p.Step, p.Kind, p.Result, p.Now
	want, ok := driver.SagaStepState(kind)
	if !ok {
		return false, nil, fmt.Errorf("sqlitedriver: saga step record: unknown kind %q", kind)
	}
	if p.Savepoint {
		if _, err := e.db.ExecContext(ctx, sagaSavepointSQL); err != nil {
			return false, nil, mapErr("saga step record", err)
		}
	}
	var inserted int
	err := e.db.QueryRowContext(ctx, e.d.expand(`INSERT INTO {{table}}saga_step (saga_id, step_name, kind, seq, result, completed_at)
		SELECT s.saga_id, ?2, ?3,
			(SELECT coalesce(max(seq), 0) + 1 FROM {{table}}saga_step WHERE saga_id = ?1), ?4, ?5
		FROM {{table}}saga s
		WHERE s.saga_id = ?1 AND s.state = ?6
		ON CONFLICT (saga_id, step_name) DO NOTHING
		RETURNING 1`), sagaID, step, kind, result, micros(now), want).Scan(&inserted)
	if err == nil {
		return true, nil, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, nil, mapErr("saga step record", err)
	}
	if p.Savepoint {
		if _, err := e.db.ExecContext(ctx, sagaReleaseSQL); err != nil {
			return false, nil, mapErr("saga step record", err)
		}
	}
	var (
		state    string
		recorded bool
		existing []byte
	)
	err = e.db.QueryRowContext(ctx, e.d.expand(`SELECT s.state, st.saga_id IS NOT NULL, st.result
		FROM {{table}}saga s
		LEFT JOIN {{table}}saga_step st ON st.saga_id = s.saga_id AND st.step_name = ?2
		WHERE s.saga_id = ?1`), sagaID, step).Scan(&state, &recorded, &existing)
	if err != nil {
		return false, nil, mapErr("saga step record", err)
	}
	if recorded {
		return false, existing, nil
	}
	return false, nil, &driver.SagaStateError{SagaID: sagaID, State: state, Want: []string{want}}
}

// The savepoint of a step recorded by StepTx (SagaStepRecordParams.Savepoint).
const (
	sagaSavepointSQL         = `SAVEPOINT idem_saga_step`
	sagaReleaseSQL           = `RELEASE SAVEPOINT idem_saga_step`
	sagaRollbackSavepointSQL = `ROLLBACK TO SAVEPOINT idem_saga_step`
)

// SagaStepEnd implements driver.SagaExecutor.
func (e *executor) SagaStepEnd(ctx context.Context, p *driver.SagaStepEndParams) error {
	if p.Failed {
		for _, q := range []string{sagaRollbackSavepointSQL, sagaReleaseSQL} {
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
	if _, err := e.db.ExecContext(ctx, sagaReleaseSQL); err != nil {
		return mapErr("saga step release", err)
	}
	return nil
}

// SagaStepSetResult implements driver.SagaExecutor.
func (e *executor) SagaStepSetResult(ctx context.Context, p *driver.SagaStepSetResultParams) error {
	sagaID, step, result := p.SagaID, p.Step, p.Result
	res, err := e.db.ExecContext(ctx, e.d.expand(`UPDATE {{table}}saga_step SET result = ?3
		WHERE saga_id = ?1 AND step_name = ?2`), sagaID, step, result)
	if err != nil {
		return mapErr("saga step set result", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return mapErr("saga step set result", err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitedriver: saga step set result %q/%q: %w", sagaID, step, driver.ErrNotFound)
	}
	return nil
}

// SagaSteps implements driver.SagaExecutor.
func (e *executor) SagaSteps(ctx context.Context, p *driver.SagaStepsParams) ([]driver.SagaStep, error) {
	sagaID := p.SagaID
	rows, err := e.db.QueryContext(ctx, e.d.expand(`SELECT saga_id, step_name, kind, seq, result, completed_at
		FROM {{table}}saga_step WHERE saga_id = ?1 ORDER BY seq`), sagaID)
	if err != nil {
		return nil, mapErr("saga steps", err)
	}
	defer func() { _ = rows.Close() }()
	var out []driver.SagaStep
	for rows.Next() {
		var (
			s         driver.SagaStep
			completed int64
		)
		if err := rows.Scan(&s.SagaID, &s.Name, &s.Kind, &s.Seq, &s.Result, &completed); err != nil {
			return nil, mapErr("saga steps", err)
		}
		s.CompletedAt = fromMicros(completed)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("saga steps", err)
	}
	return out, nil
}

// SagaList implements driver.SagaExecutor.
func (e *executor) SagaList(ctx context.Context, p *driver.SagaListParams) ([]driver.Saga, error) {
	states, limit := p.States, p.Limit
	if limit <= 0 {
		return nil, fmt.Errorf("sqlitedriver: saga list: limit %d must be positive", limit)
	}
	if len(states) == 0 {
		return nil, nil
	}
	// A page starts after (?3, ?4); NULL ?4: from the first.
	var afterID any
	if p.AfterID != "" {
		afterID = p.AfterID
	}
	rows, err := e.db.QueryContext(ctx, e.d.expand(sagaListQuery(states)), jsonStrings(states), limit, micros(p.AfterUpdatedAt), afterID)
	if err != nil {
		return nil, mapErr("saga list", err)
	}
	defer func() { _ = rows.Close() }()
	var out []driver.Saga
	for rows.Next() {
		s, err := scanSaga(rows)
		if err != nil {
			return nil, mapErr("saga list", err)
		}
		out = append(out, *s)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("saga list", err)
	}
	return out, nil
}

// sagaListQuery is SagaList's statement for states: ?1 the states (a JSON
// array), ?2 the limit, and the page's cursor (?3, ?4), NULL ?4 for the
// first page. When no state is final (a recovery loop's compensating and
// failed), it says finished_at IS NULL, which those states imply (the
// table's CHECK), so that it reads saga_unfinished_idx instead of every
// finished saga the retention keeps.
func sagaListQuery(states []string) string {
	unfinished := ""
	if !slices.ContainsFunc(states, driver.SagaFinished) {
		unfinished = " AND finished_at IS NULL"
	}
	return `SELECT ` + sagaColumns + ` FROM {{table}}saga
		WHERE state IN (SELECT value FROM json_each(?1))` + unfinished + `
		  AND (?4 IS NULL OR updated_at > ?3 OR (updated_at = ?3 AND saga_id > ?4))
		ORDER BY updated_at, saga_id LIMIT ?2`
}

// SagaDeleteFinishedBefore implements driver.SagaExecutor. The steps of the
// deleted sagas go with them (foreign key ON DELETE CASCADE, and a trigger
// for connections without PRAGMA foreign_keys).
//
// The sagas are taken after p.After in the order of the finished_at index
// (finished_at, then the primary key, saga_id).
func (e *executor) SagaDeleteFinishedBefore(ctx context.Context, p *driver.SagaDeleteFinishedBeforeParams) (driver.DeleteResult[driver.SagaCursor], error) {
	if p.Limit <= 0 {
		return driver.DeleteResult[driver.SagaCursor]{Last: p.After}, fmt.Errorf("sqlitedriver: saga delete: limit %d must be positive", p.Limit)
	}
	resume := !p.After.IsZero()
	args := []any{micros(p.Before), p.Limit}
	if resume {
		args = append(args, micros(p.After.FinishedAt), p.After.SagaID)
	}
	query := keysetSQL(`DELETE FROM {{table}}saga WHERE saga_id IN (
		SELECT saga_id FROM {{table}}saga
		WHERE finished_at IS NOT NULL AND finished_at < ?1`, `(finished_at, saga_id) > (?3, ?4)`, `
		ORDER BY finished_at, saga_id LIMIT ?2)
		RETURNING finished_at, saga_id`, resume)
	n, last, err := retentionDelete(ctx, e, "saga delete", query, args, p.After,
		func(r scanner) (driver.SagaCursor, error) {
			var c driver.SagaCursor
			var at int64
			err := r.Scan(&at, &c.SagaID)
			c.FinishedAt = fromMicros(at)
			return c, err
		},
		func(a, b driver.SagaCursor) bool {
			return cmp.Or(a.FinishedAt.Compare(b.FinishedAt), cmp.Compare(a.SagaID, b.SagaID)) < 0
		})
	return driver.DeleteResult[driver.SagaCursor]{Deleted: n, Last: last}, err
}
