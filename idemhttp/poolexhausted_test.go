package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestPoolExhaustedBySlowHandlers: two slow handlers hold both connections
// of a PostgreSQL pool of 2 (pgx and database/sql). Config.Wait bounds the
// wait for a key's lock, not for a connection: a request that waits for
// one, a new key or a duplicate of a slow one, is bounded by its
// context. With a deadline (a timeout middleware in front) it answers 503
// store-unavailable with Retry-After when the deadline passes, its handler
// not run; without one it waits for a connection and runs once one is
// free (here when a slow handler returns), however long that takes.
func TestPoolExhaustedBySlowHandlers(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"pgx", "sql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var e *env
			if name == "pgx" {
				pool, schema := testdb.Schema(t, 2)
				drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				if err := drv.Migrate(t.Context()); err != nil {
					t.Fatal(err)
				}
				e = pgEnvOn(t, drv)
			} else {
				_, schema := testdb.PostgresSQLSchema(t)
				db := testdb.SQLPool(t, schema, 2)
				drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				e = sqlEnvWith(t, drv, db, false)
			}
			var calls atomic.Int64
			release := make(chan struct{})
			inside := make(chan struct{}, 2)
			effect := effectHandler(t, e, 201, &calls)
			h := e.wrap(t, &idemhttp.Config{Wait: 200 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Query().Get("label"), "slow") {
					inside <- struct{}{}
					<-release
				}
				effect.ServeHTTP(w, r)
			}))
			slow := make(chan int, 2)
			for _, k := range []string{"slow-1", "slow-2"} {
				go func() { slow <- send(h, "POST", "/pay?label="+k, k, `{}`).Code }()
			}
			<-inside
			<-inside // both connections are held

			const deadline = 500 * time.Millisecond
			for _, c := range []struct{ key, label string }{{"new", "new"}, {"slow-1", "slow-1"}} {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				req := httptest.NewRequest("POST", "/pay?label="+c.label, strings.NewReader(`{}`)).WithContext(ctx)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", c.key)
				rr := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(rr, req)
				took := time.Since(start)
				cancel()
				checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
				if rr.Header().Get("Retry-After") == "" {
					t.Errorf("%s: no Retry-After", c.key)
				}
				// Generous for a loaded machine; a request that ignored
				// its deadline would wait for the slow handlers' release.
				if took > deadline+15*time.Second {
					t.Errorf("%s: answered after %s, its deadline was %s", c.key, took.Round(time.Millisecond), deadline)
				}
				t.Logf("%s with a %s deadline: 503 after %s", c.key, deadline, took.Round(time.Millisecond))
			}
			if n := calls.Load(); n != 0 {
				t.Fatalf("%d handler runs while the pool was taken, want 0", n)
			}

			// Without a deadline: the request waits for a connection
			// past Wait, until one is free.
			done := make(chan *httptest.ResponseRecorder, 1)
			start := time.Now()
			go func() { done <- send(h, "POST", "/pay?label=late", "late", `{}`) }()
			select {
			case rr := <-done:
				t.Fatalf("answered %d while every connection was held, after %s", rr.Code, time.Since(start))
			case <-time.After(4 * 200 * time.Millisecond): // four times Wait
			}
			close(release)
			rr := <-done
			if rr.Code != 201 || e.effects(t, "late") != 1 {
				t.Fatalf("late: %d, %d effects; want 201 once a connection was free", rr.Code, e.effects(t, "late"))
			}
			for range 2 {
				if code := <-slow; code != 201 {
					t.Errorf("slow handler: %d", code)
				}
			}
		})
	}
}
