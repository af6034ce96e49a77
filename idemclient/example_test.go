package idemclient_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
)

// A payment service protected by idemhttp whose first attempt fails with a
// 503 (not stored, so the retry executes), then a re-issue of the same
// operation with its persisted key, which the server replays.
func Example() {
	// The server: idemhttp on SQLite in front of a flaky handler.
	dir, _ := os.MkdirTemp("", "idemclient-example")
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
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE payment (id INTEGER PRIMARY KEY, body TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		log.Fatal(err)
	}
	calls := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls++; calls == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "downstream busy", http.StatusServiceUnavailable) // not stored
			return
		}
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payment (body) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, "storage error", http.StatusInternalServerError) // rolls back, not stored
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(pay))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// The client.
	c, err := idemclient.New(&idemclient.Config{
		HTTPClient: &http.Client{Timeout: 5 * time.Second},
		OnRetry: func(r idemclient.Retry) {
			// r.Delay: the server's Retry-After (1s), plus up to a tenth
			// of it at random (Config.RetryAfterJitter).
			fmt.Printf("attempt %d: %d, retrying in %s with the same key\n", r.Attempt, r.StatusCode, r.Delay.Truncate(time.Second))
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// One key per business operation, stored with it before the first
	// attempt (here: a variable standing for the operation's record).
	key, _ := idemclient.NewKey()
	send := func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req, _ = idemclient.WithKey(req, key)
		resp, err := c.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(body), "replayed:", idemclient.Replayed(resp))
	}
	send() // 503, then the retry executes
	send() // the same operation re-issued later (say, after a restart): replayed

	var n int
	_ = drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM payment`).Scan(&n)
	fmt.Println("payments:", n, "handler calls:", calls)
	// Output:
	// attempt 1: 503, retrying in 1s with the same key
	// 201 {"payment":1} replayed: false
	// 201 {"payment":1} replayed: true
	// payments: 1 handler calls: 2
}
