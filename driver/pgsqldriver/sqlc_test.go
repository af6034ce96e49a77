package pgsqldriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// The code below is what sqlc generates (emit_interface off, database/sql)
// for:
//
//	-- name: CreateTransfer :one
//	INSERT INTO transfer (amount) VALUES ($1) RETURNING id;
//	-- name: CountTransfers :one
//	SELECT count(*) FROM transfer;

type DBTX interface {
	ExecContext(context.Context, string, ...interface{}) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...interface{}) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...interface{}) *sql.Row
}

func New(db DBTX) *Queries {
	return &Queries{db: db}
}

type Queries struct {
	db DBTX
}

func (q *Queries) WithTx(tx *sql.Tx) *Queries {
	return &Queries{db: tx}
}

const createTransfer = `-- name: CreateTransfer :one
INSERT INTO transfer (amount) VALUES ($1) RETURNING id
`

func (q *Queries) CreateTransfer(ctx context.Context, amount string) (int64, error) {
	row := q.db.QueryRowContext(ctx, createTransfer, amount)
	var id int64
	err := row.Scan(&id)
	return id, err
}

const countTransfers = `-- name: CountTransfers :one
SELECT count(*) FROM transfer
`

func (q *Queries) CountTransfers(ctx context.Context) (int64, error) {
	row := q.db.QueryRowContext(ctx, countTransfers)
	var count int64
	err := row.Scan(&count)
	return count, err
}

// sqlc's Queries run inside idem's transaction: the business row and the
// idempotency record commit together, a replay does not run the query
// again, and a failed response rolls both back.
func TestSQLCQueries(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv := testdb.PostgresSQL(t)
	db := drv.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE transfer (id bigserial PRIMARY KEY, amount numeric NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, ok := idemhttp.TxFromContext[*sql.Tx](r.Context())
		if !ok {
			t.Error("no *sql.Tx in the request context")
			return
		}
		id, err := New(db).WithTx(tx).CreateTransfer(r.Context(), "10.00")
		if err != nil || r.URL.Query().Has("fail") {
			http.Error(w, fmt.Sprint("failed: ", err), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":%d}`, id)
	}))
	send := func(target, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", target, strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}
	count := func(query string) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRowContext(ctx, query).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}

	first := send("/transfers", "transfer-1")
	if first.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Code, first.Body)
	}
	if n := count(`SELECT count(*) FROM idempotency_record WHERE state = 'completed'`); n != 1 {
		t.Errorf("completed records after the first request = %d, want 1", n)
	}
	replay := send("/transfers", "transfer-1")
	if replay.Code != http.StatusCreated || replay.Body.String() != first.Body.String() ||
		replay.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Errorf("replay: %d %q replayed=%q; want the first response %q, replayed", replay.Code, replay.Body,
			replay.Header().Get(idemhttp.ReplayedHeader), first.Body)
	}
	if failed := send("/transfers?fail", "transfer-2"); failed.Code != http.StatusInternalServerError {
		t.Errorf("failing request: %d, want 500", failed.Code)
	}
	if c := calls.Load(); c != 2 {
		t.Errorf("handler ran %d times, want 2 (the replay must not run it)", c)
	}
	if n, err := New(db).CountTransfers(ctx); err != nil || n != 1 {
		t.Errorf("transfers = %d, %v; want 1 (the replay and the failed request wrote none)", n, err)
	}
	if n := count(`SELECT count(*) FROM idempotency_record`); n != 1 {
		t.Errorf("records = %d, want 1 (the failed request's rolled back)", n)
	}
}
