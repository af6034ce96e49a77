package app_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// env is the app on a fresh database behind an httptest server.
type env struct {
	t     *testing.T
	app   *app.App
	srv   *httptest.Server
	logs  *testlog.Buffer
	count func() int // rows in the payment table
}

// databases runs test on PostgreSQL and on SQLite, in parallel.
func databases(t *testing.T, test func(t *testing.T, e *env)) {
	t.Helper()
	for _, kind := range []string{app.Postgres, app.SQLite} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			test(t, newEnv(t, kind))
		})
	}
}

// dbSetting returns a -db value for a fresh database of kind and a function
// counting its payment rows.
func dbSetting(t *testing.T, kind string) (string, func() int) {
	t.Helper()
	dbArg, count := dbCounter(t, kind)
	return dbArg, func() int { return count("payment") }
}

// dbCounter returns a -db value for a fresh database of kind and a function
// counting the rows of a table.
func dbCounter(t *testing.T, kind string) (string, func(table string) int) {
	t.Helper()
	ctx := context.Background()
	if kind == app.Postgres {
		pool, schema := testdb.Schema(t, 2)
		u, err := url.Parse(testdb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), func(table string) int {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
				t.Errorf("count: %v", err)
			}
			return n
		}
	}
	path := testdb.SQLitePath(t)
	var (
		once sync.Once
		db   *sql.DB
	)
	return "sqlite:" + path, func(table string) int {
		once.Do(func() { // a second connection, as another process would have
			var err error
			if db, err = sql.Open("sqlite", sqlitedriver.DSN(path, 0)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
		})
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Errorf("count: %v", err)
		}
		return n
	}
}

func newEnv(t *testing.T, kind string) *env {
	t.Helper()
	dbArg, count := dbSetting(t, kind)
	return newEnvOn(t, dbArg, count)
}

// newEnvOn is newEnv on the database dbArg (a -db value), whose payment
// rows count counts.
func newEnvOn(t *testing.T, dbArg string, count func() int) *env {
	t.Helper()
	cfg, err := app.ParseConfig([]string{"-db", dbArg, "-kafka-dir", t.TempDir()}, func(string) string { return "" })
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
	return &env{t: t, app: a, srv: srv, logs: logs, count: count}
}

// response is what a client sees.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// problemType returns the type of a problem+json response, failing the
// test if the response is not one.
func (r response) problemType(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json (body %s)", ct, r.body)
	}
	typ, _ := r.json(t)["type"].(string)
	return typ
}

func (e *env) do(method, path string, header map[string]string, body string) response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// post sends POST /v1/payments with key (none if empty) and extra headers.
func (e *env) post(key, body string, header ...string) response {
	e.t.Helper()
	h := map[string]string{}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return e.do(http.MethodPost, "/v1/payments", h, body)
}

func paymentBody(ext string) string {
	return `{"provider":"sber","external_payment_id":"` + ext + `","amount":"100.50","customer_id":42}`
}

func newTestLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }
