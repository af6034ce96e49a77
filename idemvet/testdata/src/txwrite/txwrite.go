package txwrite

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/idemkit/idem/idemhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Server struct {
	pool *pgxpool.Pool
	db   *sql.DB
	conn *pgx.Conn
}

func (s *Server) Commits(w http.ResponseWriter, r *http.Request) {
	tx, ok := idemhttp.TxFromContext[pgx.Tx](r.Context())
	if !ok {
		http.Error(w, "no tx", http.StatusInternalServerError)
		return
	}
	if _, err := tx.Exec(r.Context(), "INSERT INTO orders VALUES (1)"); err != nil {
		tx.Rollback(r.Context()) // want "handler commits/rolls back idem's transaction"
		return
	}
	tx.Commit(r.Context()) // want "handler commits/rolls back idem's transaction"
}

func (s *Server) PoolWrite(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
	s.pool.Exec(ctx, "INSERT INTO audit VALUES (1)")                  // want "write through the pool bypasses the idempotent transaction"
	s.pool.QueryRow(ctx, "INSERT INTO audit VALUES (2) RETURNING id") // want "write through the pool bypasses"
	s.conn.Exec(ctx, "UPDATE stock SET n = n - 1")                    // want "write through the pool bypasses"
	s.pool.Begin(ctx)                                                 // want "write through the pool bypasses"
}

func SQLHandler(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idemhttp.TxFromContext[*sql.Tx](r.Context())
		if !ok {
			return
		}
		tx.ExecContext(r.Context(), "INSERT INTO orders VALUES (1)")
		db.ExecContext(r.Context(), "INSERT INTO audit VALUES (1)") // want "write through the pool bypasses"
		tx.Commit()                                                 // want "handler commits/rolls back"
	})
}

func (s *Server) CTEWrite(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
	s.pool.QueryRow(ctx, "WITH d AS (DELETE FROM carts WHERE id = $1 RETURNING id) SELECT count(*) FROM d", 1) // want "write through the pool bypasses"
	s.pool.Query(ctx, "-- SELECT\nUPDATE stock SET n = n - 1 RETURNING n")                                     // want "write through the pool bypasses"
}

// LockingReads lock rows through the pool: the lock ends with the pool's
// statement, not with the handler's transaction; EXPLAIN ANALYZE runs the
// write it explains.
func (s *Server) LockingReads(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	s.pool.QueryRow(ctx, "SELECT n FROM stock WHERE id = $1 FOR NO KEY UPDATE", 1) // want "write through the pool bypasses"
	s.db.QueryRowContext(ctx, "SELECT n FROM stock WHERE id = $1 FOR SHARE", 1)    // want "write through the pool bypasses"
	s.pool.Query(ctx, "EXPLAIN ANALYZE DELETE FROM carts WHERE id = $1", 1)        // want "write through the pool bypasses"
	tx.Exec(ctx, "UPDATE stock SET n = n - 1 WHERE id = $1", 1)
}

func (s *Server) DeferRollback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok := idemhttp.TxFromContext[pgx.Tx](ctx)
	if !ok {
		return
	}
	defer tx.Rollback(ctx) // want "handler commits/rolls back"
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
}

func (s *Server) MethodValue(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	commit := tx.Commit // want "handler commits/rolls back"
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
	commit(ctx)
	finish(ctx, tx.Rollback) // want "handler commits/rolls back"
}

func finish(ctx context.Context, end func(context.Context) error) { end(ctx) }

// LockFromVariable's SQL is a variable that may gain a locking clause;
// and a constant argument is not the SQL.
func (s *Server) LockFromVariable(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	idemhttp.TxFromContext[pgx.Tx](ctx)
	lock, q := r.URL.Query().Has("lock"), r.FormValue("q")
	query := "SELECT n FROM stock WHERE id = $1"
	if lock {
		query += " FOR UPDATE"
	}
	s.pool.QueryRow(ctx, query, 1) // want "write through the pool bypasses"
	s.pool.Query(ctx, q, "SELECT") // want "write through the pool bypasses"
}

// Not reported.

// Reads reads beside the transaction: a CTE, and queries that start with a
// comment.
func (s *Server) Reads(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	s.pool.QueryRow(ctx, "WITH p AS (SELECT price FROM products) SELECT sum(price) FROM p")
	s.pool.QueryRow(ctx, "-- current stock\nSELECT n FROM stock WHERE id = $1", 1)
	s.db.QueryContext(ctx, "/* report */ SELECT count(*) FROM orders")
	s.pool.Query(ctx, "EXPLAIN DELETE FROM carts WHERE id = $1", 1)
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
}

// ReadFromVariable holds its read's SQL in a local variable, as many
// handlers do: still a read beside the transaction.
func (s *Server) ReadFromVariable(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	query := `SELECT name FROM products WHERE id = $1`
	var name string
	s.pool.QueryRow(ctx, query, 1).Scan(&name)
	var count = "SELECT count(*) FROM orders WHERE status = $1"
	s.db.QueryRowContext(ctx, count, "paid")
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
}

// Create is the idiomatic handler: writes through the tx, answers a status.
func (s *Server) Create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok := idemhttp.TxFromContext[pgx.Tx](ctx)
	if !ok {
		http.Error(w, "no tx", http.StatusInternalServerError)
		return
	}
	var n int
	// A read beside the transaction.
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM products").Scan(&n); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ($1)", n); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// Plain owns its transaction: no idem middleware in front.
func (s *Server) Plain(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := s.pool.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO orders VALUES (1)")
	tx.Commit(ctx)
	s.pool.Exec(ctx, "INSERT INTO audit VALUES (1)")
}

// notAHandler commits a transaction it was given.
func notAHandler(r *http.Request) {
	tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
	tx.Commit(r.Context())
}

// BeginFunc opens a transaction of its own on the pool with pgx's helpers:
// its writes commit whatever the request's transaction does. A BeginFunc
// on the request's transaction is a savepoint inside it, and fine.
func (s *Server) BeginFunc(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	pgx.BeginFunc(ctx, s.pool, func(t pgx.Tx) error { // want "write through the pool bypasses"
		_, err := t.Exec(ctx, "INSERT INTO audit VALUES (1)")
		return err
	})
	pgx.BeginTxFunc(ctx, s.conn, pgx.TxOptions{}, func(t pgx.Tx) error { return nil }) // want "write through the pool bypasses"
	pgx.BeginFunc(ctx, tx, func(t pgx.Tx) error {
		_, err := t.Exec(ctx, "INSERT INTO orders VALUES (1)")
		return err
	})
}

// A repository of the package that writes through the pool, called by a
// handler that took the request's transaction: its write commits whatever
// the transaction does (reported at the call).

type orderStore struct{ pool *pgxpool.Pool }

func (st *orderStore) create(ctx context.Context, id int) error {
	_, err := st.pool.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", id)
	return err
}

func (st *orderStore) get(ctx context.Context, id int) (int, error) {
	var n int
	err := st.pool.QueryRow(ctx, "SELECT n FROM orders WHERE id = $1", id).Scan(&n)
	return n, err
}

func (st *orderStore) createTx(ctx context.Context, tx pgx.Tx, id int) error {
	_, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", id)
	return err
}

func (st *orderStore) audit(ctx context.Context, id int) {
	st.create(ctx, -id)
}

type api struct{ store *orderStore }

func (a *api) CreateViaRepo(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	_ = tx
	if err := a.store.create(ctx, 1); err != nil { // want `write through the pool bypasses the idempotent transaction \(in create\)`
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	a.store.audit(ctx, 1) // want `write through the pool bypasses the idempotent transaction \(in audit\)`
	w.WriteHeader(http.StatusCreated)
}

// Not reported: the repository given the transaction, a read through the
// pool, and a handler without idem's transaction.

func (a *api) CreateInTx(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, _ := idemhttp.TxFromContext[pgx.Tx](ctx)
	if _, err := a.store.get(ctx, 1); err != nil {
		return
	}
	a.store.createTx(ctx, tx, 1)
}

func (a *api) CreatePlain(w http.ResponseWriter, r *http.Request) {
	a.store.create(r.Context(), 1)
}
