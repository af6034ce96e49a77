package app_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// A database connection killed while the handler runs (PostgreSQL
// terminates the backend: a restart, pg_terminate_backend) rolls the
// command back: the client gets 503 store-unavailable with Retry-After,
// which any client retries, not a 500; the retry with the same key
// executes once.
func TestConnectionKilledInHandlerIs503(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 2)
	u, err := url.Parse(testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	cfg, err := app.ParseConfig([]string{"-db", u.String(), "-kafka", "off", "-cleanup", "off"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	a, err := app.New(context.Background(), cfg, newTestLogger(logs))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		srv.Close()
		a.Close()
	})
	e := &env{t: t, app: a, srv: srv, logs: logs}
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(table string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}
	// The backend that inserts a row kills itself: FATAL 57P01
	// (terminating connection due to administrator command).
	exec(`CREATE FUNCTION kill_self() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$`)
	for _, c := range []struct{ name, table, path, key, body string }{
		{"order", "customer_order", "/v1/orders", "order-killed", orderBody(7, "10.00")},
		{"payment", "payment", "/v1/payments", "payment-killed", paymentBody("killed")},
	} {
		t.Run(c.name, func(t *testing.T) {
			exec(`CREATE TRIGGER kill_self BEFORE INSERT ON ` + c.table + ` FOR EACH ROW EXECUTE FUNCTION kill_self()`)
			h := map[string]string{"Idempotency-Key": c.key}
			r := e.do(http.MethodPost, c.path, h, c.body)
			if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
				r.problemType(t) != problem.TypeStoreUnavailable {
				t.Errorf("POST with its connection killed: %d Retry-After %q %s, want 503 store-unavailable with Retry-After",
					r.status, r.header.Get("Retry-After"), r.body)
			}
			exec(`DROP TRIGGER kill_self ON ` + c.table)
			if n := count(c.table); n != 0 {
				t.Fatalf("%d rows in %s after the killed request, want 0", n, c.table)
			}
			// The 503 was not stored: the retry executes, once.
			if r := e.do(http.MethodPost, c.path, h, c.body); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("retry: %d %v %s, want 201 executed", r.status, r.header, r.body)
			}
			if r := e.do(http.MethodPost, c.path, h, c.body); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("second retry: %d %v %s, want 201 replayed", r.status, r.header, r.body)
			}
			if n := count(c.table); n != 1 {
				t.Errorf("%d rows in %s, want 1", n, c.table)
			}
		})
	}
	// One line for the one failure: the handler's (database
	// unavailable). The server rolled the killed session's transaction
	// back; the ROLLBACK that finds the connection closed is no second
	// failure to log.
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
			if !strings.Contains(l, "database unavailable") {
				t.Errorf("log line beside the handler's failure: %s", l)
			}
		}
	}
	if n := strings.Count(logs.String(), "database unavailable"); n != 2 {
		t.Errorf("%d \"database unavailable\" lines for the two killed requests; want 2:\n%s", n, logs.String())
	}
}
