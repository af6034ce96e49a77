package idemclient_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// discard is a ResponseWriter whose output never reaches the client.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// TestEndToEndLostResponse runs the client against the real idemhttp
// middleware on SQLite. The first request commits its transfer, then its
// response is lost: the connection dies before a byte of it is written. The
// client cannot know whether the transfer happened; it retries with the same
// key and gets the stored response as a replay. Exactly one transfer exists.
func TestEndToEndLostResponse(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ctx := context.Background()
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE transfer (id INTEGER PRIMARY KEY, amount TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var executions atomic.Int32
	createTransfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		body, _ := io.ReadAll(r.Body)
		res, err := tx.ExecContext(r.Context(), `INSERT INTO transfer (amount) VALUES (?)`, string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		executions.Add(1)
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	var requests atomic.Int32
	protected := mw.Handler(createTransfer)
	// loseFirst runs the protected handler (which commits), then, for the
	// first request only, kills the connection before the response is sent.
	loseFirst := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			protected.ServeHTTP(&discard{h: http.Header{}}, r)
			panic(http.ErrAbortHandler)
		}
		protected.ServeHTTP(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", loseFirst)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	var retries []idemclient.Retry
	c, s := newClient(t, &idemclient.Config{OnRetry: func(r idemclient.Retry) { retries = append(retries, r) }})
	resp, err := c.Do(post(t, srv.URL+"/transfers", `10.00`))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusCreated || body != `{"id":1}` || !idemclient.Replayed(resp) {
		t.Fatalf("got %d %s replayed=%v; want the replay of the lost 201", resp.StatusCode, body, idemclient.Replayed(resp))
	}
	if len(retries) != 1 || retries[0].Err == nil || len(s.delays()) != 1 {
		t.Fatalf("retries %+v: want one, after the transport error", retries)
	}
	if got := requests.Load(); got != 2 {
		t.Errorf("server saw %d requests, want 2", got)
	}
	var n int
	if err := drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM transfer`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || executions.Load() != 1 {
		t.Errorf("%d transfers, %d executions: want exactly one effect", n, executions.Load())
	}

	// The forbidden client of rule X3: a retry with a new key is a new
	// operation, and the money moves twice.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/transfers", strings.NewReader(`10.00`))
	req, _ = idemclient.WithKey(req, "a-new-key-for-the-same-transfer")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM transfer`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) || n != 2 {
		t.Errorf("a new key: %d replayed=%v, %d transfers; want a second execution", resp.StatusCode, idemclient.Replayed(resp), n)
	}
}

// TestEndToEndInProgress: the client's retry races the first request, which
// is still running; idemhttp answers 409 request-in-progress (Wait: NoWait)
// and the client retries after Retry-After until it gets the replay.
func TestEndToEndInProgress(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	var executions atomic.Int32
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		executions.Add(1)
		<-release
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, "charged")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Handler(slow))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(unblock) // runs before srv.Close: never leave the handler blocked

	key, _ := idemclient.NewKey()
	first, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
	first, _ = idemclient.WithKey(first, key)
	firstDone := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(first)
		if err != nil {
			t.Errorf("first: %v", err)
		}
		firstDone <- resp
	}()
	// Generous: under the whole suite on 2 busy cores, a claim on a new
	// SQLite file has taken seconds.
	for deadline := time.Now().Add(60 * time.Second); executions.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first request never started")
		}
	}

	var statuses []int
	c, _ := newClient(t, &idemclient.Config{
		Sleep: func(ctx context.Context, d time.Duration) error {
			if !jittered(d, time.Second) {
				t.Errorf("wait %s, want Retry-After 1s plus its jitter", d)
			}
			if len(statuses) == 2 {
				unblock() // the first request finishes during the second wait
				if resp := <-firstDone; resp != nil {
					resp.Body.Close()
				}
			}
			return ctx.Err()
		},
		OnRetry: func(r idemclient.Retry) { statuses = append(statuses, r.StatusCode) },
	})
	retry, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
	retry, _ = idemclient.WithKey(retry, key)
	resp, err := c.Do(retry)
	if err != nil {
		t.Fatal(err)
	}
	if b := readBody(t, resp); resp.StatusCode != http.StatusAccepted || b != "charged" || !idemclient.Replayed(resp) {
		t.Errorf("got %d %q replayed=%v", resp.StatusCode, b, idemclient.Replayed(resp))
	}
	if len(statuses) != 2 || statuses[0] != http.StatusConflict || statuses[1] != http.StatusConflict {
		t.Errorf("retried after %v, want two 409s", statuses)
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// TestEndToEndTransactionEnded: a buggy handler commits idem's transaction
// itself (and ignores the error), so idemhttp cannot store its outcome and
// answers 500 transaction-ended. On SQLite the driver turned that COMMIT
// into a rollback, so nothing is committed; on a driver that cannot (see
// pgsqldriver) the effect would be, and a retry would execute it again.
// Either way the client returns the 500 after one attempt: the handler is
// broken, and retrying cannot help.
func TestEndToEndTransactionEnded(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	ctx := context.Background()
	if _, err := drv.DB().ExecContext(ctx, `CREATE TABLE transfer (id INTEGER PRIMARY KEY, amount TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	commitsItself := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		body, _ := io.ReadAll(r.Body)
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO transfer (amount) VALUES (?)`, string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		//idemvet:ignore idemtxwrite the bug under test: committing idem's transaction must answer the 500 transaction-ended
		_ = tx.Commit()
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(mw.Handler(commitsItself))
	t.Cleanup(srv.Close)

	c, _ := newClient(t, nil)
	resp, err := c.Do(post(t, srv.URL, `10.00`))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "transaction-ended") ||
		!strings.Contains(body, "nothing was committed") {
		t.Errorf("got %d %s; want the 500 transaction-ended, nothing committed", resp.StatusCode, body)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1: the client retried after transaction-ended", n)
	}
	var n int
	if err := drv.DB().QueryRowContext(ctx, `SELECT count(*) FROM transfer`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d transfers, want 0: the handler's own COMMIT was not turned into a rollback", n)
	}
}

// TestEndToEndHandler500TooLarge: the handler's own 500 is too large to pass
// on, so idemhttp answers it with a response-too-large problem saying
// nothing was stored ("stored": false). The key is free and the failure may
// be transient: the client retries, and the second execution succeeds.
func TestEndToEndHandler500TooLarge(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{MaxResponseBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = idemhttp.TxFromContext[*sql.Tx](r.Context())
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(strings.Repeat("x", 4096)))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, _ := newClient(t, nil)
	resp, err := c.Do(post(t, srv.URL, `{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusCreated || calls.Load() != 2 {
		t.Errorf("status %d after %d handler calls, body %s; want 201 after 2", resp.StatusCode, calls.Load(), body)
	}
}
