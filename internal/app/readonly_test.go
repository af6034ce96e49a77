package app_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/dberr"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// TestDatabaseReadOnly: a failover leaves idemd's pool on a server that
// refuses writes (a hot standby reached by a host list without
// target_session_attrs, or a database a DBA set read-only; here the role's
// default_transaction_read_only, its sessions ended as a failover ends
// them). A command gets 503 store-unavailable with Retry-After, and is not
// executed. Then the database takes writes again for new sessions (the
// role's setting reset: the new primary), while the sessions opened
// meanwhile stay read-only, as sessions on a standby do: the client's retry
// with the same key executes once. Before, the pool kept its read-only
// connections and every command got 503 until they expired
// (MaxConnLifetime, an hour).
func TestDatabaseReadOnly(t *testing.T) {
	t.Parallel()
	owner, schema := testdb.Schema(t, 2)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	role := schema + "_app"
	exec(`CREATE ROLE ` + role + ` LOGIN`)
	exec(`GRANT ALL ON SCHEMA ` + schema + ` TO ` + role)
	terminate := func() {
		t.Helper()
		exec(`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = '` + role + `'`)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = owner.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = owner.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})

	u, err := url.Parse(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	cfg, err := app.ParseConfig([]string{"-db", u.String(), "-kafka", "off", "-cleanup", "off"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	a, err := app.New(ctx, cfg, newTestLogger(logs))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		srv.Close()
		a.Close()
	})
	e := &env{t: t, app: a, srv: srv, logs: logs}
	count := func() int {
		t.Helper()
		var n int
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM payment`).Scan(&n); err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}
	if r := e.post("before", paymentBody("before")); r.status != http.StatusCreated {
		t.Fatalf("POST while writable: %d %s", r.status, r.body)
	}

	exec(`ALTER ROLE ` + role + ` SET default_transaction_read_only = on`)
	terminate()
	// Several commands, several of the pool's connections.
	for i := range 3 {
		r := e.post("during", paymentBody("during"))
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
			r.problemType(t) != problem.TypeStoreUnavailable {
			t.Fatalf("POST %d while read-only: %d Retry-After %q %s, want 503 store-unavailable with Retry-After",
				i, r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("%d payments after the read-only commands, want 1", n)
	}
	// Not ready: this replica executes no command (its log says why).
	if r := e.do(http.MethodGet, "/healthz", nil, ""); r.status != http.StatusServiceUnavailable {
		t.Errorf("GET /healthz while read-only: %d %s, want 503", r.status, r.body)
	}
	if !strings.Contains(logs.String(), "read-only") {
		t.Errorf("the log does not say the database is read-only:\n%s", logs.String())
	}

	exec(`ALTER ROLE ` + role + ` RESET default_transaction_read_only`)
	if r := e.post("during", paymentBody("during")); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry once writable: %d %s, want 201 executed", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/healthz", nil, ""); r.status != http.StatusOK {
		t.Errorf("GET /healthz once writable: %d %s, want 200", r.status, r.body)
	}
	if r := e.post("during", paymentBody("during")); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("second retry: %d %s, want 201 replayed", r.status, r.body)
	}
	if n := count(); n != 2 {
		t.Errorf("%d payments, want 2", n)
	}
}

// TestDropReadOnly: the pool's hook keeps a writable session without a
// round trip or an allocation, and drops a read-only one (here read-only
// from its start: options=-c default_transaction_read_only=on) with an
// error idem counts as the database's passing failure (503, a batch
// retried).
func TestDropReadOnly(t *testing.T) { // not parallel: AllocsPerRun
	testdb.RequirePostgres(t)
	ctx := context.Background()
	connect := func(options string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		if options != "" {
			cfg.RuntimeParams["options"] = options
		}
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(ctx) })
		return c
	}
	rw := connect("")
	if ok, err := app.DropReadOnly(ctx, rw); !ok || err != nil {
		t.Fatalf("writable session: %v, %v; want kept", ok, err)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = app.DropReadOnly(ctx, rw) }); n != 0 {
		t.Errorf("%v allocations per acquire; want 0", n)
	}
	ro := connect("-c default_transaction_read_only=on")
	// PostgreSQL 12 and 13 report neither setting: the pool's AfterConnect
	// asks, and refuses the connection with the same error.
	if err := app.AskReadOnly(ctx, rw); err != nil {
		t.Fatalf("writable session at connect: %v; want accepted", err)
	}
	askErr := app.AskReadOnly(ctx, ro)
	if askErr == nil || !dberr.Transient(askErr) || dberr.SQLState(askErr) != "25006" ||
		!strings.Contains(askErr.Error(), "target_session_attrs=read-write") {
		t.Errorf("read-only session at connect: %v; want refused, 25006, transient, naming target_session_attrs", askErr)
	}
	if ro.PgConn().ParameterStatus("in_hot_standby") == "" {
		return // not reported: nothing for DropReadOnly to read
	}
	ok, err := app.DropReadOnly(ctx, ro)
	if ok || err == nil {
		t.Fatalf("read-only session: %v, %v; want dropped with an error", ok, err)
	}
	if !dberr.Transient(err) || dberr.SQLState(err) != "25006" {
		t.Errorf("error %q: SQLSTATE %q, transient %v; want 25006, transient", err, dberr.SQLState(err), dberr.Transient(err))
	}
	if !strings.Contains(err.Error(), "target_session_attrs=read-write") {
		t.Errorf("error %q does not name target_session_attrs", err)
	}
}

// TestAskReadOnlyBehindPgBouncer: through PgBouncer in transaction mode,
// which passes no in_hot_standby on, the pool's AfterConnect asks (a
// simple-protocol query, no prepared statement) and keeps a writable
// connection.
func TestAskReadOnlyBehindPgBouncer(t *testing.T) {
	t.Parallel()
	url := testdb.PgBouncer(t)
	c, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	if err := app.AskReadOnly(t.Context(), c); err != nil {
		t.Fatalf("writable session behind PgBouncer: %v; want accepted", err)
	}
	var one int
	if err := c.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the connection after the question: %d, %v", one, err)
	}
}
