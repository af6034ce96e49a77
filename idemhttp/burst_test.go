package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// TestDuplicateBurstBounded: 200 copies of one slow request at once. One
// executes and the others replay it (or answer 409 request-in-progress);
// on PostgreSQL with a pool of 4, another principal's request sent
// meanwhile is answered while the slow one still runs (the copies wait
// for the key in memory, and one of them in the store: at most one waits
// for the lock in PostgreSQL, holding a connection); and once every copy is answered the middleware leaves no
// goroutine behind. Not parallel: it counts the process's goroutines.
func TestDuplicateBurstBounded(t *testing.T) {
	for _, name := range []string{"postgres", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			var (
				e       *env
				waiting func() int // the pool's sessions waiting for a lock
			)
			if name == "postgres" {
				admin, schema := testdb.Schema(t, 1)
				app := "burst-" + schema
				pool := testdb.PoolParams(t, schema, 4, map[string]string{"application_name": app})
				waiting = func() int {
					var n int
					if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
						WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
						t.Error(err)
					}
					return n
				}
				drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				if err := drv.Migrate(t.Context()); err != nil {
					t.Fatal(err)
				}
				e = pgEnvOn(t, drv)
			} else {
				e = sqliteEnv(t)
			}
			var calls, otherCalls atomic.Int64
			inside, release := make(chan struct{}), make(chan struct{})
			slow := effectHandler(t, e, 201, &calls)
			other := effectHandler(t, e, 201, &otherCalls)
			h := e.wrap(t, &idemhttp.Config{Wait: 20 * time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("label") != "c" {
					other.ServeHTTP(w, r)
					return
				}
				close(inside) // a second run would panic here
				select {
				case <-release:
				case <-time.After(15 * time.Second):
				}
				slow.ServeHTTP(w, r)
			}))
			runtime.GC()
			before := runtime.NumGoroutine()
			burst := make(chan []*httptest.ResponseRecorder, 1)
			go func() { burst <- hammer(200, h) }()
			<-inside
			if name == "postgres" {
				// For a second while the slow request runs, at most one
				// copy waits for its lock in PostgreSQL, holding a
				// connection; the others wait in memory.
				most := 0
				for end := time.Now().Add(time.Second); time.Now().Before(end); {
					most = max(most, waiting())
				}
				if most > 1 {
					t.Errorf("%d copies waited for the key's lock in PostgreSQL at once, each holding a connection; want 1", most)
				}
				// Another principal, another key, while 199 copies wait.
				answered := make(chan int, 1)
				go func() { answered <- send(h, "POST", "/pay?label=b", "b-key", `{}`, "Authorization", "Bearer b").Code }()
				select {
				case code := <-answered:
					if code != 201 {
						t.Errorf("the other principal's request: %d, want 201", code)
					}
				case <-time.After(10 * time.Second):
					t.Errorf("the other principal's request not answered within 10s while the copies of a slow request waited")
				}
			}
			close(release)
			checkExactlyOnce(t, e, &calls, <-burst, true)
			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before+2 {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines 10s after the burst, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}
