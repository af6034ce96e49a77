package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// Three replicas on pgsqldriver, each with a database/sql pool of its own
// as teams configure them (SetMaxOpenConns(2), no idle connection kept, a
// 30ms lifetime), share one key: 30 identical requests and, once the first
// runs, 6 with another body. One execution; every identical request gets
// it or its replay; every other body is answered 409 key-reused.
func TestSQLReplicasShareKeys(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.PostgresSQLSchema(t)
			var (
				calls   atomic.Int64
				e0      *env
				running = make(chan struct{})
				once    sync.Once
				hs      []http.Handler
			)
			for range 3 {
				db := testdb.SQLPool(t, schema, 2)
				db.SetMaxIdleConns(0)
				db.SetConnMaxLifetime(30 * time.Millisecond)
				drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				e := sqlEnvWith(t, drv, db, false)
				if e0 == nil {
					e0 = e
				}
				inner := slowEffect(t, e, &calls, 150*time.Millisecond)
				hs = append(hs, e.wrap(t, &idemhttp.Config{Mode: mode, Wait: 20 * time.Second},
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						once.Do(func() { close(running) })
						inner.ServeHTTP(w, r)
					})))
			}
			others := make([]*httptest.ResponseRecorder, 6)
			var wg sync.WaitGroup
			hammered := make(chan struct{}) // no handler ran: the checks below fail
			for i := range others {
				wg.Go(func() {
					select {
					case <-running:
					case <-hammered:
					}
					others[i] = send(hs[i%3], "POST", "/pay?label=c", "one-key", fmt.Sprintf(`{"amount":"%d.00"}`, i+2))
				})
			}
			rs := hammer(30, hs...)
			close(hammered)
			wg.Wait()
			checkExactlyOnce(t, e0, &calls, rs, false)
			for _, rr := range others {
				checkProblem(t, rr, 409, problem.TypeKeyReused)
			}
		})
	}
}
