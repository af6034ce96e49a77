package idemhttp_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// PostgreSQL ends sessions on purpose, as production servers are
// configured to: idle_in_transaction_session_timeout and statement_timeout
// set on the application's role or database, pg_terminate_backend run by a
// DBA, a restart or failover (57P01 admin_shutdown). These tests run the
// middleware on a pool of ONE connection whose sessions have such settings,
// so that a retry necessarily runs on what the failure left of the pool.

// sessionEnv is a PostgreSQL backend whose middleware's pool has conns
// connections, with the session parameters params.
type sessionEnv struct {
	*env
	// query runs q, which returns one text value, in the request's
	// transaction.
	query func(r *http.Request, q string) (string, error)
	// admin is another pool on the same schema, for the test's own
	// statements while the middleware's only connection is busy.
	admin *pgxpool.Pool
}

var sessionBackends = []struct {
	name string
	mk   func(t *testing.T, conns int, params map[string]string) *sessionEnv
}{
	{"postgres", func(t *testing.T, conns int, params map[string]string) *sessionEnv {
		return pgSessionEnv(t, conns, params, false)
	}},
	{"postgres-generic", func(t *testing.T, conns int, params map[string]string) *sessionEnv {
		return pgSessionEnv(t, conns, params, true)
	}},
	{"postgres-sql", pgsqlSessionEnv},
}

func pgSessionEnv(t *testing.T, conns int, params map[string]string, hide bool) *sessionEnv {
	direct := testdb.Postgres(t)
	schema := schemaOf(t, direct)
	drv, err := pgdriver.New(testdb.PoolParams(t, schema, int32(conns), params), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	e := pgEnvWith(t, drv, hide)
	e.effects = pgEnvOn(t, direct).effects // not on the middleware's only connection
	return &sessionEnv{env: e, admin: direct.Pool(), query: func(r *http.Request, q string) (string, error) {
		tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
		var v string
		err := tx.QueryRow(r.Context(), q).Scan(&v)
		return v, err
	}}
}

func pgsqlSessionEnv(t *testing.T, conns int, params map[string]string) *sessionEnv {
	_, schema := testdb.PostgresSQLSchema(t)
	db := testdb.SQLPoolParams(t, schema, conns, params)
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	e := sqlEnvWith(t, drv, db, false)
	admin := testdb.Pool(t, schema, 2)
	e.effects = func(t *testing.T, label string) int {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM effect WHERE label = $1`, label).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return &sessionEnv{env: e, admin: admin, query: func(r *http.Request, q string) (string, error) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		var v string
		err := tx.QueryRowContext(r.Context(), q).Scan(&v)
		return v, err
	}}
}

// pid returns the backend of the request's transaction.
func (e *sessionEnv) pid(r *http.Request) (int, error) {
	v, err := e.query(r, `SELECT pg_backend_pid()::text`)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// forEachSession runs fn as a parallel subtest per PostgreSQL backend.
func forEachSession(t *testing.T, params map[string]string, fn func(t *testing.T, e *sessionEnv)) {
	t.Helper()
	for _, b := range sessionBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.mk(t, 1, params))
		})
	}
}

// waitGone waits until the server process pid has exited (up to 30 s).
func waitGone(t *testing.T, admin *pgxpool.Pool, pid int) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Errorf("pg_stat_activity: %v", err)
			return
		}
		if n == 0 {
			return
		}
	}
	t.Errorf("backend %d still there after 30s", pid)
}

// problemType returns the type of a problem+json answer ("" otherwise).
func problemType(rr *httptest.ResponseRecorder) string {
	if rr.Header().Get("Content-Type") != problem.MediaType {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(rr.Body.Bytes(), &p)
	return p.Type
}

// sessionEnded checks what a client and an operator see of a request
// whose handler wrote its effect and answered 201, and whose session the
// server ended meanwhile (end, called by the handler's first execution
// after its write; it returns once the session is gone): a 5xx
// problem+json (never the 201 of an effect rolled back), no effect, a log
// line that says what happened (logWant), and a retry with the same key
// that executes once, on the same one-connection pool, then replays.
// wantType, if not empty, is the problem type the client must get.
func sessionEnded(t *testing.T, e *sessionEnv, end func(t *testing.T, r *http.Request), wantType string, logWant ...string) {
	var (
		calls atomic.Int64
		logs  syncBuffer
	)
	h := e.wrap(t, &idemhttp.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if err := e.effect(r, "ended"); err != nil {
			t.Errorf("effect: %v", err)
		}
		if n == 1 {
			end(t, r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"execution":%d}`, n)
	}))
	rr := send(h, "POST", "/pay", "k", `{}`)
	typ := problemType(rr)
	t.Logf("first attempt: %d %s; effects %d; log: %s", rr.Code, typ, e.effects(t, "ended"), logs.String())
	if rr.Code < 500 || typ == "" {
		t.Fatalf("the session ended before the commit: answered %d %s, want a 5xx problem", rr.Code, rr.Body)
	}
	if wantType != "" && typ != wantType {
		t.Errorf("answered %d %s, want %s", rr.Code, typ, wantType)
	}
	if n := e.effects(t, "ended"); n != 0 {
		t.Fatalf("%d effects committed after the session ended, want 0", n)
	}
	for _, w := range logWant {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log %q does not say %q", logs.String(), w)
		}
	}
	rr = send(h, "POST", "/pay", "k", `{}`)
	if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "" || !strings.Contains(rr.Body.String(), `"execution":2`) {
		t.Fatalf("retry on the same pool: %d %s (replayed %q), want the second execution's 201", rr.Code, rr.Body, rr.Header().Get(idemhttp.ReplayedHeader))
	}
	rr = send(h, "POST", "/pay", "k", `{}`)
	if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" || !strings.Contains(rr.Body.String(), `"execution":2`) {
		t.Fatalf("second retry: %d %s, want the replay of the second execution", rr.Code, rr.Body)
	}
	if calls.Load() != 2 || e.effects(t, "ended") != 1 {
		t.Fatalf("calls = %d, effects = %d; want 2 and 1", calls.Load(), e.effects(t, "ended"))
	}
}

// TestIdleInTransactionTimeout: the role's
// idle_in_transaction_session_timeout (1s) ends the session of a handler
// that wrote its effect and then stayed idle in its transaction (a slow
// call elsewhere) for longer. PostgreSQL ends such a session only while it
// waits for the client (a last-moment timeout is caught before the next
// statement runs): nothing of the COMMIT was run. The client was told 503
// outcome-unknown ("may or may not have been applied") on pgdriver's and
// pgsqldriver's fast path, and the log said "commit result unknown" (or
// "store unavailable" on the generic path), not what to change. It gets
// 503 store-unavailable (not executed, retry), and the log names the
// setting.
func TestIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	forEachSession(t, map[string]string{"idle_in_transaction_session_timeout": "1s"}, func(t *testing.T, e *sessionEnv) {
		sessionEnded(t, e, func(t *testing.T, r *http.Request) {
			pid, err := e.pid(r)
			if err != nil {
				t.Errorf("pid: %v", err)
				return
			}
			waitGone(t, e.admin, pid)
		}, problem.TypeStoreUnavailable, "idle_in_transaction_session_timeout", "nothing was committed")
	})
}

// TestTerminatedWhileHandlerRuns: a DBA's pg_terminate_backend (or a
// restart: 57P01 admin_shutdown) ends the session of the request's
// transaction after the handler's write, before it answers 201.
func TestTerminatedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	forEachSession(t, nil, func(t *testing.T, e *sessionEnv) {
		sessionEnded(t, e, func(t *testing.T, r *http.Request) {
			pid, err := e.pid(r)
			if err != nil {
				t.Errorf("pid: %v", err)
				return
			}
			if _, err := e.admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Errorf("pg_terminate_backend: %v", err)
			}
			waitGone(t, e.admin, pid)
		}, "", "administrator command")
	})
}

// TestStatementTimeoutWhileWaiting: a duplicate waits for the key held by
// a running request (Config.Wait 30s), and the role's statement_timeout
// (300ms) is shorter than the wait. It cancelled the wait: the duplicate
// got 503 store-unavailable (and an ERROR "store unavailable" in the log)
// after 300ms from a healthy store, whatever Config.Wait said. The wait is
// bounded by Config.Wait alone: when the first request fails (a 503 of its
// own, not stored) a second later, the duplicate executes, with the
// role's statement_timeout (and lock_timeout) in its transaction, and a
// retry replays it.
func TestStatementTimeoutWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, b := range sessionBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			app := randomMarker("stw-")
			e := b.mk(t, 2, map[string]string{"statement_timeout": "300ms", "application_name": app})
			var (
				calls atomic.Int64
				logs  syncBuffer
			)
			entered, release := make(chan struct{}), make(chan struct{})
			h := e.wrap(t, &idemhttp.Config{Wait: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := calls.Add(1)
					if err := e.effect(r, "held"); err != nil {
						t.Errorf("effect: %v", err)
					}
					if n == 1 {
						close(entered)
						<-release
						w.WriteHeader(http.StatusServiceUnavailable) // not stored: rolled back
						return
					}
					for setting, want := range map[string]string{"statement_timeout": "300ms", "lock_timeout": "0"} {
						if v, err := e.query(r, "SHOW "+setting); err != nil || v != want {
							t.Errorf("the handler's %s after the wait: %q, %v; want the role's %q", setting, v, err, want)
						}
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = fmt.Fprintf(w, `{"execution":%d}`, n)
				}))
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- send(h, "POST", "/pay", "k", `{}`) }()
			<-entered
			dup := make(chan *httptest.ResponseRecorder, 1)
			go func() { dup <- send(h, "POST", "/pay", "k", `{}`) }()
			// The duplicate waits for a lock; past its statement_timeout,
			// the first request ends.
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				var n int
				if err := e.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n > 0 || time.Now().After(end) {
					break
				}
			}
			time.Sleep(time.Second)
			close(release)
			if rr := <-first; rr.Code != http.StatusServiceUnavailable {
				t.Fatalf("first request: %d %s, want its own 503", rr.Code, rr.Body)
			}
			rr := <-dup
			t.Logf("duplicate: %d %s", rr.Code, problemType(rr))
			if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("duplicate: %d %s; want its execution's 201; log: %s", rr.Code, rr.Body, logs.String())
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("errors logged: %s", logs.String())
			}
			rr = send(h, "POST", "/pay", "k", `{}`)
			if rr.Header().Get(idemhttp.ReplayedHeader) != "true" || calls.Load() != 2 || e.effects(t, "held") != 1 {
				t.Fatalf("retry: %d %s; calls %d, effects %d; want the replay of the second execution, 2 calls and 1 effect",
					rr.Code, rr.Body, calls.Load(), e.effects(t, "held"))
			}
		})
	}
}

// terminateApp terminates every backend whose application_name is app and
// waits for them to exit; it returns how many there were.
func terminateApp(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n); err != nil {
		t.Errorf("pg_terminate_backend: %v", err)
	}
	return n
}

// TestLeaseRenewalBackendTerminated: ModeLease (Lease 12s, renewed every
// 4s) with a handler that runs 6s outside any transaction while a DBA
// terminates the backend of the middleware's only connection twice: before
// the first renewal (at 4s) runs on it, and right before the handler
// returns (the outcome's write then finds it dead). The lease is renewed
// on a new connection, the handler's context is never cancelled, its 201
// is stored, and a retry replays it: one execution. (With Lease 3s, a CI
// run whose process stalled for 4s under load lost the lease: the
// renewal after the failed one came an interval later, and the stall
// took the rest. With Lease 6s, a run with the machine as loaded lost it
// too, its first renewal 3s late and the next one past the end.)
func TestLeaseRenewalBackendTerminated(t *testing.T) {
	t.Parallel()
	for _, b := range sessionBackends {
		if b.name == "postgres-generic" {
			continue // ModeLease takes no transaction: the same as postgres
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			app := randomMarker("lrt-")
			e := b.mk(t, 1, map[string]string{"application_name": app})
			var (
				calls, killed atomic.Int64
				logs          syncBuffer
			)
			h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: 12 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := calls.Add(1)
					for range 2 {
						time.Sleep(3 * time.Second)
						killed.Add(int64(terminateApp(t, e.admin, app)))
					}
					if err := r.Context().Err(); err != nil {
						t.Errorf("the handler's context ended: %v (%v)", err, context.Cause(r.Context()))
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = fmt.Fprintf(w, `{"execution":%d}`, n)
				}))
			rr := send(h, "POST", "/charge", "k", `{}`)
			t.Logf("first: %d %s; %d backends terminated; log: %s", rr.Code, rr.Body, killed.Load(), logs.String())
			if killed.Load() == 0 {
				t.Fatal("no backend terminated")
			}
			if rr.Code != http.StatusCreated {
				t.Fatalf("first: %d %s, want 201", rr.Code, rr.Body)
			}
			rr = send(h, "POST", "/charge", "k", `{}`)
			if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" || calls.Load() != 1 {
				t.Fatalf("retry: %d %s (replayed %q), %d executions; want the replay of the one execution",
					rr.Code, rr.Body, rr.Header().Get(idemhttp.ReplayedHeader), calls.Load())
			}
		})
	}
}
