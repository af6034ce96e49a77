package idemclient_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// lossyTransfers is a transfer endpoint behind the real idemhttp middleware
// on SQLite whose first lost requests commit their transfer, then lose the
// response (the connection dies before a byte of it is written).
type lossyTransfers struct {
	url        string
	db         *sql.DB
	executions atomic.Int32
	keys       chan string // the key of every request, in order
}

func newLossyTransfers(t *testing.T, lost int32) *lossyTransfers {
	t.Helper()
	drv := testdb.SQLite(t)
	if _, err := drv.DB().ExecContext(context.Background(), `CREATE TABLE transfer (id INTEGER PRIMARY KEY, amount TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	lt := &lossyTransfers{db: drv.DB(), keys: make(chan string, 100)}
	protected := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.TxFromContext[*sql.Tx](r.Context())
		body, _ := io.ReadAll(r.Body)
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO transfer (amount) VALUES (?)`, string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		lt.executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created "+string(body))
	}))
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lt.keys <- r.Header.Get(idemclient.HeaderKey)
		if requests.Add(1) <= lost {
			protected.ServeHTTP(&discard{h: http.Header{}}, r)
			panic(http.ErrAbortHandler)
		}
		protected.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	lt.url = srv.URL
	return lt
}

func (lt *lossyTransfers) transfers(t *testing.T) int {
	t.Helper()
	var n int
	if err := lt.db.QueryRowContext(context.Background(), `SELECT count(*) FROM transfer`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// retryHelper is a process-level retry helper of the kind a team wraps
// every outbound call in: it calls send again while it fails.
func retryHelper(tries int, send func() error) error {
	var err error
	for range tries {
		if err = send(); err == nil {
			return nil
		}
	}
	return err
}

// A keyless POST handed to Do by a retry helper of the caller's: Do ran out
// of attempts (every response lost after the transfer committed), the
// helper calls Do again with the same request. That is a retry of the same
// operation: it must carry the key Do generated the first time, and get the
// replay; a new key executed the transfer a second time.
func TestRetryHelperReusesGeneratedKey(t *testing.T) {
	t.Parallel()
	for _, getBody := range []bool{true, false} {
		name := "GetBody"
		if !getBody {
			name = "buffered body"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lt := newLossyTransfers(t, 2)
			c, _ := newClient(t, &idemclient.Config{MaxAttempts: 2})
			req := post(t, lt.url, `10.00`)
			if !getBody {
				// A body net/http cannot rewind: Do buffers it.
				req.GetBody, req.Body = nil, io.NopCloser(strings.NewReader(`10.00`))
			}
			var resp *http.Response
			var errs []error
			err := retryHelper(3, func() error {
				var err error
				resp, err = c.Do(req)
				if err != nil {
					errs = append(errs, err)
				}
				return err
			})
			if err != nil {
				t.Fatalf("the helper gave up: %v", err)
			}
			body := readBody(t, resp)
			close(lt.keys)
			var keys []string
			for k := range lt.keys {
				keys = append(keys, k)
			}
			var e *idemclient.Error
			if len(errs) != 1 || !errors.As(errs[0], &e) || e.Attempts != 2 {
				t.Fatalf("errors %v; want one *Error after 2 attempts", errs)
			}
			for i, k := range keys {
				if k != e.Key {
					t.Errorf("request %d carried key %q; want %q, the operation's, on every one: %q", i+1, k, e.Key, keys)
				}
			}
			if n := lt.transfers(t); n != 1 || lt.executions.Load() != 1 {
				t.Errorf("%d transfers, %d executions; want exactly one effect", n, lt.executions.Load())
			}
			if resp.StatusCode != http.StatusCreated || body != "created 10.00" || !idemclient.Replayed(resp) {
				t.Errorf("got %d %q replayed=%v; want the replay of the lost 201", resp.StatusCode, body, idemclient.Replayed(resp))
			}
			if req.Header.Get(idemclient.HeaderKey) != "" {
				t.Error("Do modified the caller's request")
			}
		})
	}
}

// Two requests built apart are two operations, even with the same body:
// each gets its own key.
func TestSeparateRequestsGetSeparateKeys(t *testing.T) {
	t.Parallel()
	lt := newLossyTransfers(t, 0)
	c, _ := newClient(t, nil)
	for range 2 {
		resp, err := c.Do(post(t, lt.url, `10.00`))
		if err != nil {
			t.Fatal(err)
		}
		if b := readBody(t, resp); resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) {
			t.Fatalf("got %d %q replayed=%v; want a new transfer", resp.StatusCode, b, idemclient.Replayed(resp))
		}
	}
	if n := lt.transfers(t); n != 2 {
		t.Errorf("%d transfers, want 2", n)
	}
}

// A streaming body (no GetBody, no length) over MaxBodyBytes is refused
// before anything is sent, and so is the same request handed to Do again by
// a retry helper: Do read part of its body the first time, and what is left
// of it is no request to send.
func TestRetryHelperBodyTooLargeRefusedAgain(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, &idemclient.Config{MaxBodyBytes: 1000})
	req, err := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader(strings.Repeat("x", 1500))))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("Do %d: response %d; want ErrBodyTooLarge", i+1, resp.StatusCode)
		}
		if !errors.Is(err, idemclient.ErrBodyTooLarge) {
			t.Fatalf("Do %d: %v; want ErrBodyTooLarge", i+1, err)
		}
	}
	if as := rec.seen(); len(as) != 0 {
		t.Errorf("the server got %d requests (first body %d bytes); want none", len(as), len(as[0].body))
	}
}

// One request handed to Do from several goroutines at once is one
// operation: every attempt of every Do carries one key.
func TestSameRequestConcurrentOneKey(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, nil)
	req := post(t, srv.URL, `{"amount":"1.00"}`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp, err := c.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	as := rec.seen()
	if len(as) != 8 {
		t.Fatalf("%d requests, want 8", len(as))
	}
	checkSameKeyAndBody(t, as, `{"amount":"1.00"}`)
}
