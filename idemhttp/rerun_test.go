package idemhttp_test

import (
	"database/sql"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// A ModeTx (pgdriver fast path) request whose completed record's INSERT
// loses to a ModeLease claim of the same scope runs its handler again once
// that claim is released: the second run must see the request body.
func TestHandlerRunAgainSeesTheBody(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	var mu sync.Mutex
	var bodies []string
	txInside, txGo := make(chan struct{}), make(chan struct{})
	leaseInside, leaseGo := make(chan struct{}), make(chan struct{})
	var txRuns atomic.Int32
	txMW, err := idemhttp.New[pgx.Tx](drv, &idemhttp.Config{Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	leaseMW, err := idemhttp.New[pgx.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease})
	if err != nil {
		t.Fatal(err)
	}
	txH := txMW.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		if txRuns.Add(1) == 1 {
			close(txInside)
			<-txGo
		}
		if len(b) == 0 {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"empty body"}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	leaseH := leaseMW.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(leaseInside)
		<-leaseGo
		w.WriteHeader(http.StatusServiceUnavailable) // not stored: released
	}))
	txDone := make(chan int, 1)
	go func() { txDone <- send(txH, "POST", "/pay", "k", `{"amount":100}`).Code }()
	<-txInside
	leaseDone := make(chan int, 1)
	go func() { leaseDone <- send(leaseH, "POST", "/pay", "k", `{"amount":100}`).Code }()
	<-leaseInside
	close(txGo) // the tx INSERT hits the lease's in-progress row: ErrLeaseLost, poll
	time.Sleep(300 * time.Millisecond)
	close(leaseGo) // released
	t.Logf("lease: %d", <-leaseDone)
	code := <-txDone
	mu.Lock()
	t.Logf("tx: %d, bodies seen by the handler: %q", code, bodies)
	mu.Unlock()
	if code != http.StatusCreated {
		t.Fatalf("tx request answered %d, want 201; the handler's second run read bodies %q", code, bodies)
	}
	// And the key now replays:
	if rr := send(txH, "POST", "/pay", "k", `{"amount":100}`); rr.Code != http.StatusCreated {
		t.Fatalf("retry answered %d %s", rr.Code, rr.Body)
	}
}

// An outer middleware sets a default header the handler overrides: the
// executed response has the handler's value only, and so has a replay,
// from the store and from the cache (it had both values).
func TestReplayReplacesOuterHeaders(t *testing.T) {
	t.Parallel()
	for _, cache := range []int64{0, idemhttp.NoReplayCache} {
		drv := testdb.SQLite(t)
		mw, err := idemhttp.New[*sql.Tx](drv, &idemhttp.Config{ReplayCacheBytes: cache})
		if err != nil {
			t.Fatal(err)
		}
		inner := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "private, max-age=0")
			w.Header().Set("Content-Type", "application/vnd.pay+json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":1}`))
		}))
		outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-store")
			w.Header().Set("Content-Type", "application/json")
			inner.ServeHTTP(w, r)
		})
		first := send(outer, "POST", "/pay", "k", `{}`)
		second := send(outer, "POST", "/pay", "k", `{}`)
		t.Logf("cache=%d first: %q %q; replay: %q %q", cache, first.Header().Values("Cache-Control"), first.Header().Values("Content-Type"),
			second.Header().Values("Cache-Control"), second.Header().Values("Content-Type"))
		for _, name := range []string{"Content-Type", "Cache-Control"} {
			if got, want := second.Header().Values(name), first.Header().Values(name); len(got) != 1 || got[0] != want[0] {
				t.Errorf("cache=%d: replay %s %q, executed %q", cache, name, got, want)
			}
		}
	}
}
