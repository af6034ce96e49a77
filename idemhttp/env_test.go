package idemhttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// env is one backend under test: a migrated driver plus a business table
// "effect" that handlers write to, so tests count executions in the
// database, where a double effect would really show.
type env struct {
	name string
	// wrap builds the middleware with cfg and wraps h.
	wrap func(t *testing.T, cfg *idemhttp.Config, h http.Handler) http.Handler
	// effect writes one effect row for the request: in the middleware's
	// transaction (ModeTx) or on its own (ModeLease).
	effect func(r *http.Request, label string) error
	// effects counts the effect rows with label.
	effects func(t *testing.T, label string) int
	// kill breaks the request's transaction connection (PostgreSQL only).
	kill func(r *http.Request) error
	// exec runs a statement on the database, outside any transaction.
	exec func(t *testing.T, sql string)
	// txExec runs a statement in the request's transaction (ModeTx).
	txExec func(r *http.Request, sql string) error
	// endTx commits (or rolls back) the request's transaction, as a
	// handler must not.
	endTx func(r *http.Request, commit bool) error
	// driver exposes the untyped executor for direct record inspection.
	executor   driver.Executor
	closeStore func()
}

// backendList names every backend; every behaviour test runs on all.
var backendList = []struct {
	name string
	mk   func(t *testing.T) *env
}{
	{"postgres", pgEnv}, {"sqlite", sqliteEnv},
	// The same without driver.TxClaimer: the generic ModeTx path (Begin,
	// RecordClaim, RecordComplete, Commit) that other backends take.
	{"postgres-generic", func(t *testing.T) *env { return pgEnvWith(t, testdb.Postgres(t), true) }},
	{"sqlite-generic", func(t *testing.T) *env { return sqliteEnvWith(t, testdb.SQLite(t), true) }},
	// PostgreSQL over database/sql (pgsqldriver, with its TxClaimer).
	{"postgres-sql", func(t *testing.T) *env {
		drv := testdb.PostgresSQL(t)
		return sqlEnvWith(t, drv, drv.DB(), false)
	}},
}

// generic is a backend with nothing but what idemhttp needs (transactions and
// the record store): no TxClaimer, no inbox, outbox, saga or lock methods,
// as a third-party backend for the middleware alone would be. It keeps the
// backend's driver.EndedRollbacker (every backend here has one).
type generic[TTx any] struct{ driver.RecordDriver[TTx] }

func (g generic[TTx]) RollbackEnded(ctx context.Context, tx TTx) error {
	return g.RecordDriver.(driver.EndedRollbacker[TTx]).RollbackEnded(ctx, tx)
}

// withoutTxClaimer returns drv, or drv reduced to a driver.RecordDriver.
func withoutTxClaimer[TTx any](drv driver.Driver[TTx], hide bool) driver.RecordDriver[TTx] {
	if hide {
		return generic[TTx]{drv}
	}
	return drv
}

// forEach runs fn as a parallel subtest per backend, each on a fresh store.
func forEach(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, b := range backendList {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.mk(t))
		})
	}
}

func pgEnv(t *testing.T) *env {
	drv := testdb.Postgres(t)
	return pgEnvOn(t, drv)
}

func pgEnvOn(t *testing.T, drv *pgdriver.Driver) *env { return pgEnvWith(t, drv, false) }

func pgEnvWith(t *testing.T, drv *pgdriver.Driver, hideTxClaimer bool) *env {
	ctx := context.Background()
	if _, err := drv.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS effect (label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	name := "postgres"
	if hideTxClaimer {
		name = "postgres-generic"
	}
	return &env{
		name: name,
		wrap: func(t *testing.T, cfg *idemhttp.Config, h http.Handler) http.Handler {
			mw, err := idemhttp.New(withoutTxClaimer[pgx.Tx](drv, hideTxClaimer), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return mw.Handler(h)
		},
		effect: func(r *http.Request, label string) error {
			if tx, ok := idemhttp.TxFromContext[pgx.Tx](r.Context()); ok {
				_, err := tx.Exec(r.Context(), `INSERT INTO effect (label) VALUES ($1)`, label)
				return err
			}
			_, err := drv.Pool().Exec(r.Context(), `INSERT INTO effect (label) VALUES ($1)`, label)
			return err
		},
		effects: func(t *testing.T, label string) int {
			var n int
			if err := drv.Pool().QueryRow(ctx, `SELECT count(*) FROM effect WHERE label = $1`, label).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		kill: func(r *http.Request) error {
			tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
			var pid int
			if err := tx.QueryRow(r.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			_, err := drv.Pool().Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
			return err
		},
		exec: func(t *testing.T, q string) {
			if _, err := drv.Pool().Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		},
		txExec: func(r *http.Request, q string) error {
			tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
			_, err := tx.Exec(r.Context(), q)
			return err
		},
		endTx: func(r *http.Request, commit bool) error {
			tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
			if commit {
				return tx.Commit(r.Context())
			}
			return tx.Rollback(r.Context())
		},
		executor:   drv.Executor(),
		closeStore: drv.Pool().Close,
	}
}

func sqliteEnv(t *testing.T) *env {
	drv := testdb.SQLite(t)
	return sqliteEnvOn(t, drv)
}

func sqliteEnvOn(t *testing.T, drv *sqlitedriver.Driver) *env { return sqliteEnvWith(t, drv, false) }

func sqliteEnvWith(t *testing.T, drv *sqlitedriver.Driver, hideTxClaimer bool) *env {
	return sqlEnvWith(t, drv, drv.DB(), hideTxClaimer)
}

// sqlEnvWith is the env of a database/sql backend: SQLite, or PostgreSQL
// through pgsqldriver (whose placeholders are $1, not ?).
func sqlEnvWith(t *testing.T, drv driver.Driver[*sql.Tx], db *sql.DB, hideTxClaimer bool) *env {
	ctx := context.Background()
	name, ph := "sqlite", "?"
	if drv.Name() == "postgres" {
		name, ph = "postgres-sql", "$1"
	}
	if hideTxClaimer {
		name += "-generic"
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS effect (label TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{
		name: name,
		wrap: func(t *testing.T, cfg *idemhttp.Config, h http.Handler) http.Handler {
			mw, err := idemhttp.New(withoutTxClaimer[*sql.Tx](drv, hideTxClaimer), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return mw.Handler(h)
		},
		effect: func(r *http.Request, label string) error {
			if tx, ok := idemhttp.TxFromContext[*sql.Tx](r.Context()); ok {
				_, err := tx.ExecContext(r.Context(), `INSERT INTO effect (label) VALUES (`+ph+`)`, label)
				return err
			}
			_, err := db.ExecContext(r.Context(), `INSERT INTO effect (label) VALUES (`+ph+`)`, label)
			return err
		},
		effects: func(t *testing.T, label string) int {
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM effect WHERE label = `+ph, label).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		kill: func(r *http.Request) error {
			if name == "sqlite" || name == "sqlite-generic" {
				return fmt.Errorf("kill: no server connection to kill on SQLite")
			}
			tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
			var pid int
			if err := tx.QueryRowContext(r.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			_, err := db.ExecContext(context.Background(), `SELECT pg_terminate_backend($1, 5000)`, pid)
			return err
		},
		exec: func(t *testing.T, q string) {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		},
		txExec: func(r *http.Request, q string) error {
			tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
			_, err := tx.ExecContext(r.Context(), q)
			return err
		},
		endTx: func(r *http.Request, commit bool) error {
			tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
			if commit {
				return tx.Commit()
			}
			return tx.Rollback()
		},
		executor:   drv.Executor(),
		closeStore: func() { _ = db.Close() },
	}
}

// effectHandler writes an effect labelled by the body's "label" query
// parameter (or "x") and answers status with a JSON body numbering the
// execution, so a replay is distinguishable from a second execution.
func effectHandler(t *testing.T, e *env, status int, calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		label := r.URL.Query().Get("label")
		if label == "" {
			label = "x"
		}
		if err := e.effect(r, label); err != nil {
			t.Errorf("effect: %v", err)
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/things/"+label)
		w.Header().Set("X-Not-Replayed", "1")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"execution":%d,"label":%q}`, n, label)
	})
}

// send performs one request against h and returns the response.
// waitStarted waits until a handler closed running. It fails the test if
// its request was answered first (its status on answered: the claim
// failed) or nothing happened within 30 s, instead of waiting for ever.
func waitStarted(t *testing.T, running <-chan struct{}, answered <-chan int) {
	t.Helper()
	select {
	case <-running:
	case code := <-answered:
		t.Fatalf("the request was answered %d without running the handler", code)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30 s")
	}
}

func send(h http.Handler, method, target, key, body string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return rr
}

func body(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func testdbSQLite(t *testing.T) *sqlitedriver.Driver { return testdb.SQLite(t) }
