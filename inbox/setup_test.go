package inbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

// fixture is one backend with a business table "effect": the handlers of
// the tests write one row per applied event through the transaction, and
// the tests count rows to see how often an event took effect.
type fixture[TTx any] struct {
	drv driver.Driver[TTx]
	// effect writes the effect of event id for consumer through tx.
	effect func(ctx context.Context, tx TTx, consumer string, id uuid.UUID) error
	// effects counts the committed effects of (consumer, id).
	effects func(t *testing.T, consumer string, id uuid.UUID) int
	// processed counts the committed processed_event rows of (consumer, id).
	processed func(t *testing.T, consumer string, id uuid.UUID) int
	// kill terminates the database connection of tx from another
	// connection, as a crashed host would lose it. Nil when the backend
	// has no such thing (SQLite).
	kill func(t *testing.T, tx TTx)
	// childEnv tells a child process (crash tests) how to reach the same
	// database.
	childEnv []string
}

func (f *fixture[TTx]) inbox(t *testing.T, consumer string) *inbox.Inbox[TTx] {
	t.Helper()
	ib, err := inbox.New(f.drv, &inbox.Config{Consumer: consumer})
	if err != nil {
		t.Fatalf("inbox.New(%q): %v", consumer, err)
	}
	return ib
}

// apply is the handler of most tests: it writes the effect.
func (f *fixture[TTx]) apply(consumer string, id uuid.UUID) func(ctx context.Context, tx TTx) error {
	return func(ctx context.Context, tx TTx) error { return f.effect(ctx, tx, consumer, id) }
}

func (f *fixture[TTx]) mustEffects(t *testing.T, consumer string, id uuid.UUID, want int) {
	t.Helper()
	if got := f.effects(t, consumer, id); got != want {
		t.Errorf("event %s took effect %d times for %q; want %d", id, got, consumer, want)
	}
}

func (f *fixture[TTx]) mustProcessed(t *testing.T, consumer string, id uuid.UUID, want int) {
	t.Helper()
	if got := f.processed(t, consumer, id); got != want {
		t.Errorf("event %s has %d processed_event rows for %q; want %d", id, got, consumer, want)
	}
}

const (
	pgEffectTable     = `CREATE TABLE effect (event_id uuid NOT NULL, consumer text NOT NULL)`
	sqliteEffectTable = `CREATE TABLE effect (event_id TEXT NOT NULL, consumer TEXT NOT NULL)`
)

func pgEffect(ctx context.Context, tx pgx.Tx, consumer string, id uuid.UUID) error {
	_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, consumer) VALUES ($1, $2)`, id.String(), consumer)
	return err
}

func sqliteEffect(ctx context.Context, tx *sql.Tx, consumer string, id uuid.UUID) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effect (event_id, consumer) VALUES (?, ?)`, id.String(), consumer)
	return err
}

// pgDriver opens a driver on schema (tables there, and on the search_path
// for the effect table).
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
	pool, schema := testdb.Schema(t, 24) // 20 concurrent transactions and some
	drv := pgDriver(t, pool, schema)
	if err := drv.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, pgEffectTable); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	count := func(t *testing.T, query, consumer string, id uuid.UUID) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(t.Context(), query, consumer, id.String()).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	return &fixture[pgx.Tx]{
		drv:    drv,
		effect: pgEffect,
		effects: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM effect WHERE consumer = $1 AND event_id = $2`, consumer, id)
		},
		processed: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM processed_event WHERE consumer_name = $1 AND event_id = $2`, consumer, id)
		},
		kill: func(t *testing.T, tx pgx.Tx) {
			t.Helper()
			testdb.Terminate(t, pool, tx)
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
	if _, err := db.ExecContext(t.Context(), sqliteEffectTable); err != nil {
		t.Fatalf("create effect table: %v", err)
	}
	count := func(t *testing.T, query, consumer string, id uuid.UUID) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), query, consumer, id.String()).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	return &fixture[*sql.Tx]{
		drv:    drv,
		effect: sqliteEffect,
		effects: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM effect WHERE consumer = ? AND event_id = ?`, consumer, id)
		},
		processed: func(t *testing.T, consumer string, id uuid.UUID) int {
			return count(t, `SELECT count(*) FROM processed_event WHERE consumer_name = ? AND event_id = ?`, consumer, id)
		},
		childEnv: []string{envBackend + "=sqlite", envTarget + "=" + path},
	}
}

// scenario is a behaviour test written once for every backend.
type scenario[TTx any] struct {
	name string
	fn   func(t *testing.T, f *fixture[TTx])
}

func scenarios[TTx any]() []scenario[TTx] {
	return []scenario[TTx]{
		{"RedeliveredEventTakesEffectOnce", testRedeliveredOnce[TTx]},
		{"HandlerErrorLeavesNothing", testHandlerError[TTx]},
		{"HandlerPanicLeavesNothing", testHandlerPanic[TTx]},
		{"ConcurrentDuplicatesOneEffect", testConcurrentDuplicates[TTx]},
		{"ConcurrentDuplicatesFirstFails", testConcurrentFirstFails[TTx]},
		{"ConsumersApplyOnceEach", testConsumers[TTx]},
		{"NilEventIDRejected", testNilEventID[TTx]},
		{"ProcessTxJoinsCallerTx", testProcessTx[TTx]},
		{"NilTxRefused", testNilTxRefused[TTx]},
		{"Batch/Duplicates", testBatchDuplicates[TTx]},
		{"Batch/FailureRollsBackAll", testBatchFailure[TTx]},
		{"Batch/NilEventID", testBatchNilID[TTx]},
		{"Batch/Empty", testBatchEmpty[TTx]},
		{"Batch/Tx", testProcessBatchTx[TTx]},
		{"Batch/Concurrent", testBatchConcurrent[TTx]},
		{"Crash/RolledBackTx", testCrashRolledBack[TTx]},
		{"Crash/ProcessExitsBeforeCommit", testCrashProcessExit[TTx]},
		{"Crash/ConnectionKilledBeforeCommit", testCrashConnectionKilled[TTx]},
		{"OnResult", testOnResult[TTx]},
		{"ProcessedAtFromConfigNow", testProcessedAt[TTx]},
		{"CleanedUpEventAppliesAgain", testCleanedUp[TTx]},
	}
}

func runScenarios[TTx any](t *testing.T, setup func(t *testing.T) *fixture[TTx]) {
	for _, sc := range scenarios[TTx]() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.fn(t, setup(t))
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

func newID(t *testing.T) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatalf("uuid.NewV7: %v", err)
	}
	return id
}

// With pgx, a context cancelled after the handler wrote its effect does not
// undo it: the inbox commits the effect with its dedup row (a shutdown
// finishes the work in flight). (database/sql ties a transaction to the
// context it began with and rolls it back itself: nothing is applied then,
// and a redelivery applies the event.)
func TestCancelledAfterTheEffectCommits(t *testing.T) {
	t.Parallel()
	testdb.RequirePostgres(t)
	f := setupPostgres(t)
	ib := f.inbox(t, "billing")
	id := newID(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	applied, err := ib.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		if err := f.effect(ctx, tx, "billing", id); err != nil {
			return err
		}
		cancel() // the shutdown comes now
		return nil
	})
	if !applied || err != nil {
		t.Fatalf("Process cancelled after the effect = %v, %v; want applied, nil", applied, err)
	}
	f.mustEffects(t, "billing", id, 1)
	f.mustProcessed(t, "billing", id, 1)
}
