package pgsqldriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
)

// The idemhttp middleware on a *sql.DB: the handler writes through the
// *sql.Tx of the request, which commits together with the stored response,
// so a retried request is answered from the record and never writes twice.
// (Not run: it needs a PostgreSQL server; TestSQLCQueries runs the same.)
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: "idem"})
	if err != nil {
		log.Fatal(err)
	}
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	mw, err := idemhttp.New(drv, nil) // ModeTx
	if err != nil {
		log.Fatal(err)
	}
	createTransfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		var id int64
		err := tx.QueryRowContext(r.Context(),
			`INSERT INTO transfer (amount) VALUES ($1) RETURNING id`, "10.00").Scan(&id)
		if err != nil {
			http.Error(w, "storage error", http.StatusInternalServerError) // rolls back
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	http.Handle("POST /transfers", mw.Handler(createTransfer))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
