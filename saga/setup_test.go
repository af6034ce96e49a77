package saga_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"modernc.org/sqlite"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/saga"
)

// fixture is one backend with a business table "effect": every step and
// compensation of the tests writes one row (saga, step) through its
// transaction, and the tests count rows to see how often a step took effect
// and in which order.
type fixture[TTx any] struct {
	drv driver.Driver[TTx]
	// effect writes one effect of (sagaID, step) through tx.
	effect func(ctx context.Context, tx TTx, sagaID, step string) error
	// bad runs a statement that fails (on PostgreSQL it aborts tx).
	bad func(ctx context.Context, tx TTx) error
	// log returns the committed effects of sagaID, step names in the order
	// they were written.
	log func(t *testing.T, sagaID string) []string
	// outbox returns the committed outbox payloads stored under id.
	outbox func(t *testing.T, id uuid.UUID) []string
	// kill terminates the database connection of tx, as a crashed host
	// would lose it. Nil for SQLite.
	kill func(t *testing.T, tx TTx)
	// exec runs a statement in tx. Nil for SQLite.
	exec func(ctx context.Context, tx TTx, stmt string) error
	// readOnly makes SQLite's only connection refuse every write from the
	// next statement of tx on (PRAGMA query_only: SQLITE_READONLY, as a
	// filesystem remounted read-only gives) until writable; nil for
	// PostgreSQL. The scenarios that use it are isolated: the shared
	// database would refuse the other scenarios' writes too.
	readOnly func(ctx context.Context, t *testing.T, tx TTx)
	writable func(t *testing.T)
	// authorize installs an authorizer on SQLite's only connection that
	// refuses (SQLITE_AUTH) the writes to a table for which deny returns
	// true, as a revoked privilege would; nil for PostgreSQL.
	authorize func(t *testing.T, deny func(table string) bool)
	// childEnv tells a child process (crash tests) how to reach the
	// database.
	childEnv []string
	// replica, if set, is a second driver on the same database (another
	// pool, another SQLite connection): the Race scenarios run their
	// second Coordinator on it.
	replica driver.Driver[TTx]
}

// replicaCoordinator is a Coordinator on f.replica, or on f.drv without one.
func (f *fixture[TTx]) replicaCoordinator(t *testing.T) *saga.Coordinator[TTx] {
	t.Helper()
	if f.replica == nil {
		return f.coordinator(t, nil)
	}
	c, err := saga.New(f.replica, &saga.Config{CompensationBackoff: time.Millisecond})
	if err != nil {
		t.Fatalf("saga.New: %v", err)
	}
	return c
}

// coordinator returns a Coordinator with fast compensation retries.
func (f *fixture[TTx]) coordinator(t *testing.T, cfg *saga.Config) *saga.Coordinator[TTx] {
	t.Helper()
	c := saga.Config{CompensationBackoff: time.Millisecond}
	if cfg != nil {
		c = *cfg
	}
	co, err := saga.New(f.drv, &c)
	if err != nil {
		t.Fatalf("saga.New: %v", err)
	}
	return co
}

// apply is the function of most steps: it writes the effect and returns
// "result of <step>".
func (f *fixture[TTx]) apply(sagaID, step string) saga.StepFunc[TTx] {
	return func(ctx context.Context, tx TTx) ([]byte, error) {
		if err := f.effect(ctx, tx, sagaID, step); err != nil {
			return nil, err
		}
		return resultOf(step), nil
	}
}

// undo is the compensation of most tests: it writes the effect of the
// compensation step and checks it got the forward step's result.
func (f *fixture[TTx]) undo(t *testing.T, sagaID string) saga.CompensationFunc[TTx] {
	return func(ctx context.Context, tx TTx, fwd saga.StepRecord) ([]byte, error) {
		if string(fwd.Result) != string(resultOf(fwd.Name)) {
			t.Errorf("compensation of %s got the forward result %q; want %q", fwd.Name, fwd.Result, resultOf(fwd.Name))
		}
		if err := f.effect(ctx, tx, sagaID, saga.CompensationName(fwd.Name)); err != nil {
			return nil, err
		}
		return []byte("undone " + fwd.Name), nil
	}
}

func resultOf(step string) []byte { return []byte("result of " + step + "\x00\xff") }

// count returns how many effects step of sagaID has.
func (f *fixture[TTx]) count(t *testing.T, sagaID, step string) int {
	t.Helper()
	n := 0
	for _, s := range f.log(t, sagaID) {
		if s == step {
			n++
		}
	}
	return n
}

func (f *fixture[TTx]) mustEffects(t *testing.T, sagaID, step string, want int) {
	t.Helper()
	if got := f.count(t, sagaID, step); got != want {
		t.Errorf("saga %s: step %s took effect %d times; want %d (log %v)", sagaID, step, got, want, f.log(t, sagaID))
	}
}

func (f *fixture[TTx]) mustLog(t *testing.T, sagaID string, want ...string) {
	t.Helper()
	if got := f.log(t, sagaID); !slices.Equal(got, want) {
		t.Errorf("saga %s: effects %v; want %v", sagaID, got, want)
	}
}

func (f *fixture[TTx]) begin(t *testing.T) TTx {
	t.Helper()
	tx, err := f.drv.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = f.drv.Rollback(context.Background(), tx) })
	return tx
}

func (f *fixture[TTx]) commit(t *testing.T, tx TTx) {
	t.Helper()
	if err := f.drv.Commit(t.Context(), tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func (f *fixture[TTx]) rollback(t *testing.T, tx TTx) {
	t.Helper()
	if err := f.drv.Rollback(t.Context(), tx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
}

// start starts a saga of type "order" in its own transaction.
func (f *fixture[TTx]) start(t *testing.T, c *saga.Coordinator[TTx], sagaID string) {
	t.Helper()
	tx := f.begin(t)
	if _, created, err := c.StartTx(t.Context(), tx, sagaID, "order", []byte(`{"order":1}`)); err != nil || !created {
		t.Fatalf("Start(%s) = created %v, %v; want a new saga", sagaID, created, err)
	}
	f.commit(t, tx)
}

// run runs step in its own transaction and checks whether fn ran.
func run[TTx any](t *testing.T, c *saga.Coordinator[TTx], sagaID, step string, fn saga.StepFunc[TTx], wantRan bool) []byte {
	t.Helper()
	res, ran, err := c.Step(t.Context(), sagaID, step, fn)
	if err != nil {
		t.Fatalf("Step(%s, %s): %v", sagaID, step, err)
	}
	if ran != wantRan {
		t.Fatalf("Step(%s, %s): ran = %v; want %v", sagaID, step, ran, wantRan)
	}
	return res
}

func mustGet[TTx any](t *testing.T, c *saga.Coordinator[TTx], sagaID string) *saga.Saga {
	t.Helper()
	s, err := c.Get(t.Context(), sagaID)
	if err != nil {
		t.Fatalf("Get(%s): %v", sagaID, err)
	}
	return s
}

func stepNames(s *saga.Saga) []string {
	out := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		out[i] = st.Name
	}
	return out
}

func newSagaID(t testing.TB) string {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatalf("uuid.NewV7: %v", err)
	}
	return id.String()
}

var errBoom = errors.New("step failed")

const (
	pgTables     = `CREATE TABLE effect (id bigserial PRIMARY KEY, saga_id text NOT NULL, step text NOT NULL)`
	sqliteTables = `CREATE TABLE effect (id INTEGER PRIMARY KEY AUTOINCREMENT, saga_id TEXT NOT NULL, step TEXT NOT NULL)`
)

// badStatement fails: its table does not exist.
const badStatement = `INSERT INTO no_such_table VALUES (1)`

func sqlBad(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, badStatement)
	return err
}

func pgEffect(ctx context.Context, tx pgx.Tx, sagaID, step string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effect (saga_id, step) VALUES ($1, $2)`, sagaID, step)
	return err
}

func sqliteEffect(ctx context.Context, tx *sql.Tx, sagaID, step string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effect (saga_id, step) VALUES (?, ?)`, sagaID, step)
	return err
}

func pgDriver(t testing.TB, pool *pgxpool.Pool, schema string) *pgdriver.Driver {
	t.Helper()
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgdriver.New: %v", err)
	}
	return drv
}

func setupPostgres(t *testing.T) *fixture[pgx.Tx] {
	t.Helper()
	ctx := t.Context()
	pool, schema := testdb.Schema(t, 24)
	drv := pgDriver(t, pool, schema)
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, pgTables); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	return &fixture[pgx.Tx]{
		drv:    drv,
		effect: pgEffect,
		bad: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, badStatement)
			return err
		},
		log: pgStepLog(pool),
		outbox: func(t *testing.T, id uuid.UUID) []string {
			t.Helper()
			rows, err := pool.Query(t.Context(), `SELECT convert_from(payload, 'UTF8') FROM outbox WHERE event_id = $1`, id.String())
			if err != nil {
				t.Fatalf("read outbox: %v", err)
			}
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatalf("read outbox: %v", err)
			}
			return out
		},
		kill: func(t *testing.T, tx pgx.Tx) {
			t.Helper()
			testdb.Terminate(t, pool, tx)
		},
		exec: func(ctx context.Context, tx pgx.Tx, stmt string) error {
			_, err := tx.Exec(ctx, stmt)
			return err
		},
		childEnv: []string{envBackend + "=postgres", envTarget + "=" + schema},
	}
}

func setupSQLite(t *testing.T) *fixture[*sql.Tx] {
	t.Helper()
	path := testdb.SQLitePath(t)
	drv, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatalf("sqlitedriver.Open: %v", err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	if err := drv.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	db := drv.DB()
	if _, err := db.ExecContext(t.Context(), sqliteTables); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	query := func(t *testing.T, q string, arg any) []string {
		t.Helper()
		rows, err := db.QueryContext(t.Context(), q, arg)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer func() { _ = rows.Close() }()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			out = append(out, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return out
	}
	return &fixture[*sql.Tx]{
		drv:    drv,
		effect: sqliteEffect,
		bad:    sqlBad,
		log: func(t *testing.T, sagaID string) []string {
			return query(t, `SELECT step FROM effect WHERE saga_id = ? ORDER BY id`, sagaID)
		},
		outbox: func(t *testing.T, id uuid.UUID) []string {
			return query(t, `SELECT CAST(payload AS TEXT) FROM outbox WHERE event_id = ?`, id.String())
		},
		readOnly: func(ctx context.Context, t *testing.T, tx *sql.Tx) {
			t.Helper()
			if _, err := tx.ExecContext(ctx, `PRAGMA query_only = ON`); err != nil {
				t.Fatalf("PRAGMA query_only = ON: %v", err)
			}
		},
		writable: func(t *testing.T) {
			t.Helper()
			if _, err := db.ExecContext(t.Context(), `PRAGMA query_only = OFF`); err != nil {
				t.Fatalf("PRAGMA query_only = OFF: %v", err)
			}
		},
		authorize: func(t *testing.T, deny func(table string) bool) {
			t.Helper()
			conn, err := db.Conn(t.Context())
			if err != nil {
				t.Fatalf("the connection: %v", err)
			}
			defer func() { _ = conn.Close() }()
			fn := func(action sqlite.AuthorizerActionCode, table, _, _, _ string) sqlite.AuthorizerReturnCode {
				if (action == sqlite.AuthInsert || action == sqlite.AuthUpdate || action == sqlite.AuthDelete) && deny(table) {
					return sqlite.AuthorizerDeny
				}
				return sqlite.AuthorizerOK
			}
			err = conn.Raw(func(dc any) error {
				r, ok := dc.(sqlite.AuthorizerRegisterer)
				if !ok {
					return fmt.Errorf("%T has no authorizer", dc)
				}
				return r.RegisterAuthorizer(fn)
			})
			if err != nil {
				t.Fatalf("RegisterAuthorizer: %v", err)
			}
		},
		childEnv: []string{envBackend + "=sqlite", envTarget + "=" + path},
	}
}

// scenario is a behaviour test written once for every backend. Scenarios
// share one database per backend (their sagas have distinct IDs), which
// keeps the suite fast; an isolated one gets a database of its own because
// it looks at the whole saga table.
type scenario[TTx any] struct {
	name     string
	fn       func(t *testing.T, f *fixture[TTx])
	isolated bool
}

func scenarios[TTx any]() []scenario[TTx] {
	return []scenario[TTx]{
		{name: "Start/Idempotent", fn: testStartIdempotent[TTx]},
		{name: "Step/EveryStepRetriedAtEveryPoint", fn: testStepRetriedAtEveryPoint[TTx]},
		{name: "Step/JoinsCallerTx", fn: testStepJoinsCallerTx[TTx]},
		{name: "Step/ConcurrentRedelivery", fn: testStepConcurrent[TTx]},
		{name: "Step/ConcurrentRedeliveryFirstFails", fn: testStepConcurrentFirstFails[TTx]},
		{name: "Step/PanicLeavesNothing", fn: testStepPanic[TTx]},
		{name: "StepTx/FailureLeavesNothing", fn: testStepTxFailureLeavesNothing[TTx]},
		{name: "StepTx/RetryInSameTx", fn: testStepTxRetryInSameTx[TTx]},
		{name: "StepTx/PanicLeavesNothing", fn: testStepTxPanicLeavesNothing[TTx]},
		{name: "StepTx/FailedStatementLeavesTxUsable", fn: testStepTxFailedStatement[TTx]},
		{name: "StepTx/CancelledUndoBounded", fn: testStepTxCancelledUndoBounded[TTx]},
		{name: "Step/SagaNotStarted", fn: testStepNotStarted[TTx]},
		{name: "Step/InvalidNames", fn: testStepInvalidNames[TTx]},
		{name: "Tx/NilTransactionRefused", fn: testNilTxRefused[TTx]},
		{name: "Step/SameNameTwiceSkipped", fn: testStepSameNameTwice[TTx]},
		{name: "StepTx/AbortInsideFailedStepUndone", fn: testStepTxAbortInsideFailedStep[TTx]},
		{name: "Step/RefusedOnceAborted", fn: testStepRefusedOnceAborted[TTx]},
		{name: "Complete", fn: testComplete[TTx]},
		{name: "Compensate/FailureAtStepN", fn: testCompensateFailureAtN[TTx]},
		{name: "Compensate/CalledAgain", fn: testCompensateCalledAgain[TTx]},
		{name: "Compensate/ConcurrentCalls", fn: testCompensateConcurrent[TTx]},
		{name: "Compensate/FailsOnceInTheMiddle", fn: testCompensateFailsOnce[TTx]},
		{name: "Compensate/TransientFailureRetried", fn: testCompensateRetried[TTx]},
		{name: "Compensate/DatabaseFaultNotAnAttempt", fn: testCompensateDatabaseFault[TTx], isolated: true},
		{name: "Compensate/PrivilegeRefusedNotAnAttempt", fn: testCompensatePrivilegeRefused[TTx], isolated: true},
		{name: "Compensate/TimeoutIsAnAttempt", fn: testCompensateTimeoutIsAnAttempt[TTx]},
		{name: "Compensate/RetriedAtEveryPoint", fn: testCompensateRetriedAtEveryPoint[TTx]},
		{name: "Compensate/MissingCompensation", fn: testCompensateMissing[TTx]},
		{name: "Compensate/FnErrorWrapsSagaSentinel", fn: testCompensateFnErrorWrapsSagaSentinel[TTx]},
		{name: "Compensate/NothingToUndo", fn: testCompensateNothing[TTx]},
		{name: "Compensate/InFlightStepIsCompensated", fn: testCompensateWaitsForStep[TTx]},
		{name: "Compensate/FromInsideAStepRefused", fn: testCompensateFromInsideStep[TTx]},
		{name: "Abort/ThenRecover", fn: testAbortThenRecover[TTx]},
		{name: "Resume/RunningSaga", fn: testResumeRunning[TTx]},
		{name: "Resume/DrivenByEventsAfterRestarts", fn: testResumeDrivenByEvents[TTx], isolated: true},
		{name: "Emit/DeterministicIDs", fn: testEmitDeterministic[TTx]},
		{name: "Emit/RetriedStepReemitsSameIDs", fn: testEmitRetried[TTx]},
		{name: "Emit/TwoEventsUnderOneName", fn: testEmitConflict[TTx]},
		{name: "Crash/ProcessExitsBeforeCommit", fn: testCrashStep[TTx]},
		{name: "Crash/ProcessExitsDuringCompensation", fn: testCrashCompensation[TTx]},
		{name: "Crash/ConnectionKilledBeforeCommit", fn: testCrashConnectionKilled[TTx]},
		{name: "Trace/PanickingStepSpan", fn: testStepPanicSpan[TTx]},
		{name: "DeleteFinished", fn: testDeleteFinished[TTx], isolated: true},
		{name: "Cleanup/FinishedSagasSwept", fn: testCleanupFinished[TTx], isolated: true},
		{name: "Race/StepsAndCompensate", fn: testRaceStepsAndCompensate[TTx]},
		{name: "Race/AbortAndComplete", fn: testRaceAbortComplete[TTx]},
		{name: "Race/FlakyCompensations", fn: testRaceCompensateFlaky[TTx]},
		{name: "Race/RedeliveryAndComplete", fn: testRaceRedeliveryAndComplete[TTx]},
		{name: "List/RunningByStart", fn: testListRunningByStart[TTx]},
		{name: "List/PagesUnderChanges", fn: testListAfterUnderChanges[TTx], isolated: true},
	}
}

func runScenarios[TTx any](t *testing.T, setup func(t *testing.T) *fixture[TTx]) {
	shared := setup(t) // cleaned up once every scenario finished
	for _, sc := range scenarios[TTx]() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			f := shared
			if sc.isolated {
				f = setup(t)
			}
			sc.fn(t, f)
		})
	}
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	runScenarios(t, setupPostgres)
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	runScenarios(t, setupSQLite)
}

// stepsN returns the names step-1 .. step-n.
func stepsN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("step-%d", i+1)
	}
	return out
}

// pgStepLog returns the steps whose effect a saga wrote in pool's effect
// table, in order.
func pgStepLog(pool *pgxpool.Pool) func(t *testing.T, sagaID string) []string {
	return func(t *testing.T, sagaID string) []string {
		t.Helper()
		rows, err := pool.Query(t.Context(), `SELECT step FROM effect WHERE saga_id = $1 ORDER BY id`, sagaID)
		if err != nil {
			t.Fatalf("read effects: %v", err)
		}
		steps, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("read effects: %v", err)
		}
		return steps
	}
}
