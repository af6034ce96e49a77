package idemclient_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// A command answered 303 See Other (the payment was created, read it
// there), behind the real idemhttp on SQLite. Its re-issue with the same
// key is answered by the replay of that 303, which the http.Client follows
// with a GET of the payment: the response Do returns is the GET's, but
// the command was a replay, and Replayed must say so (a caller sending a
// receipt only for an operation executed now sent it twice).
func TestReplayedThroughSeeOther(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ctx := context.Background()
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE payment (id INTEGER PRIMARY KEY, amount TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var executions atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		body, _ := io.ReadAll(r.Body)
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payment (amount) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		executions.Add(1)
		id, _ := res.LastInsertId()
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
		w.WriteHeader(http.StatusSeeOther)
	})))
	mux.HandleFunc("GET /payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		var amount string
		if err := drv.DB().QueryRowContext(r.Context(), `SELECT amount FROM payment WHERE id = ?`, r.PathValue("id")).Scan(&amount); err != nil {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%s,"amount":%q}`, r.PathValue("id"), amount)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	c, _ := newClient(t, nil)
	key, _ := idemclient.NewKey()
	for i, wantReplayed := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`10.00`))
		req, _ = idemclient.WithKey(req, key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != http.StatusOK || body != `{"id":1,"amount":"10.00"}` {
			t.Fatalf("send %d: %d %q; want the payment, read after the 303", i+1, resp.StatusCode, body)
		}
		if got := idemclient.Replayed(resp); got != wantReplayed {
			t.Errorf("send %d: Replayed = %v, want %v", i+1, got, wantReplayed)
		}
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// Replayed follows the redirect chain back through 303s only: a replayed
// 307 or 308 sent the command again, elsewhere, whose answer is the final
// response's.
func TestReplayedRedirectChain(t *testing.T) {
	t.Parallel()
	hop := func(status int, replayed bool, prev *http.Response) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}, Request: &http.Request{Response: prev}}
		if replayed {
			r.Header.Set(idemclient.HeaderReplayed, "true")
		}
		return r
	}
	tests := []struct {
		name string
		resp *http.Response
		want bool
	}{
		{"303 replayed", hop(200, false, hop(303, true, nil)), true},
		{"303 executed", hop(200, false, hop(303, false, nil)), false},
		{"two 303s, first replayed", hop(200, false, hop(303, false, hop(303, true, nil))), true},
		{"307 replayed", hop(201, false, hop(307, true, nil)), false},
		{"308 replayed", hop(201, false, hop(308, true, nil)), false},
		{"final replayed after 307", hop(201, true, hop(307, false, nil)), true},
		{"no request", &http.Response{StatusCode: 200, Header: http.Header{}}, false},
	}
	for _, tc := range tests {
		if got := idemclient.Replayed(tc.resp); got != tc.want {
			t.Errorf("%s: Replayed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
