package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// TestRecordWriteRefusedNotUnknown: ModeTx, the handler's writes done,
// the completed record's write is refused by the server with a passing
// error: an operator's CREATE INDEX (without CONCURRENTLY) on idem's
// records table holds a SHARE lock, and the application's lock_timeout
// ends the record's INSERT (55P03) while the request waits for it.
// PostgreSQL rolled the transaction back (the pipelined COMMIT never ran),
// so the outcome is known: 503 store-unavailable with Retry-After, not
// outcome-unknown; the handler's effect is not there, and the retry, once
// the lock is gone, executes exactly once.
func TestRecordWriteRefusedNotUnknown(t *testing.T) {
	params := map[string]string{"lock_timeout": "300ms"}
	cases := []struct {
		name string
		mk   func(t *testing.T) (*env, *pgxpool.Pool, string)
	}{
		{"postgres", func(t *testing.T) (*env, *pgxpool.Pool, string) {
			owner, schema := migratedSchema(t)
			drv, err := pgdriver.New(testdb.PoolParams(t, schema, 4, params), &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			return pgEnvOn(t, drv), owner, schema
		}},
		{"postgres-sql", func(t *testing.T) (*env, *pgxpool.Pool, string) {
			owner, schema := testdb.Schema(t, 2)
			db := testdb.SQLPoolParams(t, schema, 4, params)
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			if err := drv.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			return sqlEnvWith(t, drv, db, false), owner, schema
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, lock, _ := c.mk(t)
			var logs testlog.Buffer
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeTx, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				effectHandler(t, e, http.StatusCreated, &calls))
			ctx := context.Background()
			tx, err := lock.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			// What CREATE INDEX takes: reads go on, writes wait.
			if _, err := tx.Exec(ctx, `LOCK TABLE idempotency_record IN SHARE MODE`); err != nil {
				t.Fatal(err)
			}
			rr := send(h, "POST", "/pay?label=ri", "k1", `{}`)
			checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			if ra := rr.Header().Get("Retry-After"); ra == "" {
				t.Error("no Retry-After: the failure passes")
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("the handler ran %d times; want 1", n)
			}
			if n := e.effects(t, "ri"); n != 0 {
				t.Fatalf("effects after the refused record write = %d; want 0", n)
			}
			log := logs.String()
			if !strings.Contains(log, "55P03") || strings.Contains(log, "result unknown") {
				t.Errorf("log does not say the server refused the record (55P03), or says the outcome is unknown:\n%s", log)
			}
			if err := tx.Rollback(ctx); err != nil { // the index is built
				t.Fatal(err)
			}
			again := send(h, "POST", "/pay?label=ri", "k1", `{}`)
			if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) == "true" {
				t.Fatalf("retry: %d replayed=%q; want a new execution (201)", again.Code, again.Header().Get(idemhttp.ReplayedHeader))
			}
			replay := send(h, "POST", "/pay?label=ri", "k1", `{}`)
			if replay.Code != http.StatusCreated || replay.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("second retry: %d replayed=%q; want the replay", replay.Code, replay.Header().Get(idemhttp.ReplayedHeader))
			}
			if n, c := e.effects(t, "ri"), calls.Load(); n != 1 || c != 2 {
				t.Fatalf("effects = %d, executions = %d; want 1 and 2", n, c)
			}
		})
	}
}

// TestCommitRefusedNotUnknown: ModeTx under SERIALIZABLE (the role's
// default_transaction_isolation), a concurrent transaction commits a write
// skew with the handler's while it runs: PostgreSQL answers the COMMIT
// with 40001 ("canceled on identification as a pivot, during commit
// attempt") and rolls the transaction back. The outcome is known: 503
// store-unavailable with Retry-After, not outcome-unknown, on the generic
// ModeTx path (Backend.Commit); the retry executes once.
func TestCommitRefusedNotUnknown(t *testing.T) {
	params := map[string]string{"default_transaction_isolation": "serializable"}
	// Only the generic path: pgdriver's and pgsqldriver's claims refuse
	// an isolation level other than read committed.
	mk := map[string]func(t *testing.T) (*env, *pgxpool.Pool){
		"postgres-generic": func(t *testing.T) (*env, *pgxpool.Pool) { return serializablePG(t, params) },
	}
	for name, mk := range mk {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var skew atomic.Bool
			e, owner := mk(t)
			// The write skew, committed by a concurrent transaction after
			// the record's write, right before the request's COMMIT.
			beforeCommit = func() {
				if !skew.Swap(false) {
					return
				}
				ctx := context.Background()
				tx, err := owner.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
				if err == nil {
					_, err = tx.Exec(ctx, `SELECT count(*) FROM effect WHERE label = 'mine'`)
				}
				if err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO effect (label) VALUES ('other')`)
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					t.Errorf("concurrent transaction: %v", err)
				}
			}
			var logs testlog.Buffer
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeTx, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := calls.Add(1)
					if err := e.txExec(r, `SELECT count(*) FROM effect WHERE label = 'other'`); err != nil {
						t.Error(err)
					}
					if err := e.effect(r, "mine"); err != nil {
						t.Error(err)
					}
					if n == 1 {
						skew.Store(true)
					}
					w.WriteHeader(http.StatusCreated)
				}))
			rr := send(h, "POST", "/pay", "k1", `{}`)
			checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			if ra := rr.Header().Get("Retry-After"); ra == "" {
				t.Error("no Retry-After: the failure passes")
			}
			if n := e.effects(t, "mine"); n != 0 {
				t.Fatalf("effects after the refused COMMIT = %d; want 0", n)
			}
			if log := logs.String(); !strings.Contains(log, "40001") || strings.Contains(log, "result unknown") {
				t.Errorf("log does not say the server refused the COMMIT (40001), or says the outcome is unknown:\n%s", log)
			}
			again := send(h, "POST", "/pay", "k1", `{}`)
			if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) == "true" {
				t.Fatalf("retry: %d replayed=%q; want a new execution (201)", again.Code, again.Header().Get(idemhttp.ReplayedHeader))
			}
			replay := send(h, "POST", "/pay", "k1", `{}`)
			if replay.Code != http.StatusCreated || replay.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("second retry: %d replayed=%q; want the replay", replay.Code, replay.Header().Get(idemhttp.ReplayedHeader))
			}
			if n, c := e.effects(t, "mine"), calls.Load(); n != 1 || c != 2 {
				t.Fatalf("effects = %d, executions = %d; want 1 and 2", n, c)
			}
		})
	}
}

// serializablePG is a pgdriver env on the generic path (without its
// TxClaimer) whose sessions have params and whose Commit runs
// beforeCommit first, and a pool of the schema's owner.
func serializablePG(t *testing.T, params map[string]string) (*env, *pgxpool.Pool) {
	owner, schema := migratedSchema(t)
	drv, err := pgdriver.New(testdb.PoolParams(t, schema, 4, params), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	e := pgEnvWith(t, drv, true)
	e.wrap = func(t *testing.T, cfg *idemhttp.Config, h http.Handler) http.Handler {
		mw, err := idemhttp.New[pgx.Tx](hookedCommit{generic[pgx.Tx]{drv}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return mw.Handler(h)
	}
	return e, owner
}

// beforeCommit is run by hookedCommit's Commit (one test sets it).
var beforeCommit func()

// hookedCommit is the generic path whose Commit runs beforeCommit first.
type hookedCommit struct{ generic[pgx.Tx] }

func (h hookedCommit) Commit(ctx context.Context, tx pgx.Tx) error {
	beforeCommit()
	return h.generic.Commit(ctx, tx)
}
