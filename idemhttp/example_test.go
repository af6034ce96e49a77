package idemhttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
)

// ModeTx: the handler writes through the middleware's transaction, which
// commits together with the stored response.
func Example_transactionBound() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	ctx := context.Background()
	if err := drv.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	_, _ = drv.DB().ExecContext(ctx, `CREATE TABLE transfer (id INTEGER PRIMARY KEY, amount TEXT NOT NULL)`)

	mw, err := idemhttp.New(drv, &idemhttp.Config{
		// Keys belong to the authenticated client: its stable ID, as your
		// authentication middleware found it (here, one client).
		Scope: func(*http.Request) (string, error) { return "client-42", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	createTransfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		res, err := tx.ExecContext(r.Context(), `INSERT INTO transfer (amount) VALUES ('10.00')`)
		if err != nil {
			http.Error(w, "storage error", http.StatusInternalServerError) // rolls back
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", mw.Handler(createTransfer))

	for range 2 { // a client retry with the same key
		req := httptest.NewRequest("POST", "/transfers", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e0f7a52-transfer-1")
		rr := httptest.NewRecorder()
		mux.ServeHTTP(rr, req)
		fmt.Println(rr.Code, rr.Body.String(), "replayed:", rr.Header().Get("Idempotent-Replayed") == "true")
	}
	var n int
	_ = drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM transfer`).Scan(&n)
	fmt.Println("transfers:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// transfers: 1
}

// ModeLease: the effect is outside the database (here a counter standing for
// a payment provider). The key is passed downstream so the provider can
// deduplicate the window lease mode cannot close.
func Example_lease() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	drv, err := sqlitedriver.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	if err := drv.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(drv, &idemhttp.Config{
		Mode:  idemhttp.ModeLease,
		Scope: func(*http.Request) (string, error) { return "client-42", nil }, // the authenticated client
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := idemhttp.KeyFromContext(r.Context())
		charges++ // provider.Charge(ctx, amount, idempotencyKey=key)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"charge":%d,"key":%q}`, charges, key)
	})
	h := mw.Handler(charge)
	for range 3 {
		req := httptest.NewRequest("POST", "/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "charge-42")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		fmt.Println(rr.Code, rr.Body.String())
	}
	fmt.Println("provider calls:", charges)
	// Output:
	// 202 {"charge":1,"key":"charge-42"}
	// 202 {"charge":1,"key":"charge-42"}
	// 202 {"charge":1,"key":"charge-42"}
	// provider calls: 1
}
