package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
)

// SQLite scenarios: the same command on a SQLite file, with its own bare
// baseline (SQLite serialises writers: its ratios are not comparable with
// PostgreSQL's).
const (
	pathSQLiteBare    = "/sqlite/bare/payments"
	pathSQLiteIdem    = "/sqlite/idem/payments"
	pathSQLiteNoCache = "/sqlite/idemnc/payments"
)

// runSQLite measures bare, idem first, and idem replays with the cache on
// and off, on a fresh SQLite file, and prints their table.
func runSQLite(ctx context.Context, o options, runID string, hc *http.Client) error {
	dir, err := os.MkdirTemp("", "httpbench-sqlite-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	drv, err := sqlitedriver.Open(filepath.Join(dir, "bench.db"), nil)
	if err != nil {
		return err
	}
	defer func() { _ = drv.Close() }()
	if err := drv.Migrate(ctx); err != nil {
		return err
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE payment (
		id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL, customer_id INTEGER NOT NULL,
		amount TEXT NOT NULL, currency TEXT NOT NULL)`); err != nil {
		return err
	}
	shared := func(*http.Request) string { return "/payments" }
	mux := http.NewServeMux()
	mux.Handle("POST "+pathSQLiteBare, sqliteBare(drv))
	for _, r := range []struct {
		path string
		cfg  idemhttp.Config
	}{
		{pathSQLiteIdem, idemhttp.Config{Route: shared, Scope: principal}},
		{pathSQLiteNoCache, idemhttp.Config{Route: shared, Scope: principal, ReplayCacheBytes: idemhttp.NoReplayCache}},
	} {
		mw, err := idemhttp.New(drv, &r.cfg)
		if err != nil {
			return err
		}
		mux.Handle("POST "+r.path, as(pathSQLiteIdem, mw.Handler(sqliteIdemHandler())))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	set := newScenarioSet(runID, o.keys)
	var done executed
	scs := []*scenario{
		{id: "sa", name: "sqlite bare (no idem)", path: pathSQLiteBare, next: set.fresh("sqlite-bare"), ok: created},
		{id: "sb", name: "sqlite idem first execution", path: pathSQLiteIdem, next: set.fresh("sqlite-idem"), ok: created,
			done: done.record, info: true},
		{id: "sc", name: "sqlite idem replay, cache on", path: pathSQLiteIdem, next: set.replay("sqlite-idem", &done), ok: replayed,
			replays: "sb", info: true},
		{id: "sd", name: "sqlite idem replay, cache off", path: pathSQLiteNoCache, next: set.replay("sqlite-idem", &done), ok: replayed,
			replays: "sb", info: true},
	}
	fmt.Println("SQLite (one file, writers serialised; RT, WAL and PG CPU do not apply)")
	if err := drive(ctx, hc, srv.URL, &meter{}, scs, o); err != nil {
		return err
	}
	return printTable(os.Stdout, scs)
}

// sqliteInsert is the business effect on SQLite: one INSERT, in tx.
func sqliteInsert(ctx context.Context, tx *sql.Tx, key string, p *paymentRequest) ([]byte, error) {
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO payment (idem_key, customer_id, amount, currency)
		VALUES (?, ?, ?, ?) RETURNING id`, key, p.CustomerID, p.Amount, p.Currency).Scan(&id)
	if err != nil {
		return nil, err
	}
	return paymentCreated(id, p.Amount, p), nil
}

func sqliteServe(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
	return serveWith(w, r, func(ctx context.Context, key string, p *paymentRequest) ([]byte, error) {
		return sqliteInsert(ctx, tx, key, p)
	})
}

// sqliteBare is scenario sa: BEGIN IMMEDIATE; INSERT; COMMIT; 201.
func sqliteBare(drv *sqlitedriver.Driver) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := drv.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback() }()
		var buf bufferedResponse
		if err := sqliteServe(&buf, r, tx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		buf.writeTo(w)
	})
}

// sqliteIdemHandler is the handler behind idemhttp on SQLite.
func sqliteIdemHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idemhttp.TxFromContext[*sql.Tx](r.Context())
		if !ok {
			http.Error(w, "no transaction in context", http.StatusInternalServerError)
			return
		}
		if err := sqliteServe(w, r, tx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}
