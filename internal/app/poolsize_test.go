package app_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
)

// The pool's size set in -db (pool_max_conns, the documented way to size
// a replica's connections) and the same URL given to -db-listen, as an
// operator copies it: the pool holds at most that many connections, and
// the listener's one connection LISTENs (pgx would send the pool's
// parameters to the server as settings, which refuses them: unrecognized
// configuration parameter "pool_max_conns").
func TestPoolMaxConnsInDBAndDBListen(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, "postgres")
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	appName := fmt.Sprintf("poolsize_%d", time.Now().UnixNano())
	q := u.Query()
	q.Set("application_name", appName)
	q.Set("pool_max_conns", "2")
	q.Set("pool_min_conns", "1")
	u.RawQuery = q.Encode()
	s := serveOn(t, u.String(), count, "-db-listen", u.String())
	for i := range 5 {
		r := s.do(http.MethodPost, "/v1/orders", fmt.Sprintf("order-%d", i), orderBody(7, "19.90"))
		if r.status != http.StatusCreated {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
	}
	pool := testdb.Pool(t, q.Get("search_path"), 2)
	ctx := context.Background()
	var listening, sessions int
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && listening == 0; time.Sleep(100 * time.Millisecond) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE query LIKE 'LISTEN %'), count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&listening, &sessions); err != nil {
			t.Fatal(err)
		}
	}
	if listening == 0 {
		t.Fatalf("no LISTEN session with -db-listen %q (%d sessions of idemd)", u.Redacted(), sessions)
	}
	if sessions > 3 {
		t.Errorf("%d sessions of idemd, want at most pool_max_conns (2) + the listener's", sessions)
	}
	t.Logf("%d sessions of idemd: pool_max_conns 2 + the listener's", sessions)
}

// With -db-notify=false an order's transaction enqueues its events
// without pg_notify and nothing LISTENs: the relay polls, and the order
// still goes through the saga (its events published and consumed).
func TestNoNotifyOrdersGoThrough(t *testing.T) {
	t.Parallel()
	dbArg, count := dbCounter(t, "postgres")
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	appName := fmt.Sprintf("nonotify_%d", time.Now().UnixNano())
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	s := serveOn(t, u.String(), count, "-db-notify=false")
	r := s.do(http.MethodPost, "/v1/orders", "nonotify-1", orderBody(7, "19.90"))
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["id"].(string)
	s.waitStatus(id, "CONFIRMED")
	pool := testdb.Pool(t, q.Get("search_path"), 2)
	var listening, sessions int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE query LIKE 'LISTEN %'), count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&listening, &sessions); err != nil {
		t.Fatal(err)
	}
	if sessions == 0 {
		t.Fatalf("no session of idemd with application_name %s", appName)
	}
	if listening != 0 {
		t.Errorf("%d LISTEN sessions of idemd with -db-notify=false (of %d)", listening, sessions)
	}
}
