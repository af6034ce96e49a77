package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// A stalled database: another session holds the payment table's lock (a
// migration's ALTER TABLE waiting on a long transaction, a LOCK TABLE).
// The requests that got a connection wait for the lock; those behind
// them wait for a connection of the exhausted pool. Every one of them,
// new keys and a read alike, answers 503 store-unavailable with
// Retry-After within the request timeout, rather than holding its client
// until the client gives up (it hung for as long as the client waited);
// nothing is committed, and once the lock is gone the retries with the
// same keys execute once each.
func TestStalledDatabaseAnswers503WithinRequestTimeout(t *testing.T) {
	t.Parallel()
	dbArg, count := dbSetting(t, app.Postgres)
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	schema := u.Query().Get("search_path")
	e := newEnvOn(t, dbArg, count)
	if r := e.post("warm", paymentBody("warm")); r.status != http.StatusCreated {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	id, _ := e.post("warm", paymentBody("warm")).json(t)["id"].(string)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	lock, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "payment"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	const n = 8 // more than the pool's connections (4 at least)
	type answer struct {
		status     int
		typ, retry string
		took       time.Duration
		err        error
	}
	answers := make([]answer, n+1)
	client := &http.Client{Timeout: time.Minute} // a patient client
	send := func(req *http.Request) answer {
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return answer{err: err, took: time.Since(start)}
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		a := answer{status: res.StatusCode, retry: res.Header.Get("Retry-After"), took: time.Since(start)}
		if res.StatusCode != http.StatusCreated {
			a.typ = response{status: res.StatusCode, header: res.Header, body: b}.problemType(t)
		}
		return a
	}
	m := stallmeter.Start(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", strings.NewReader(paymentBody(fmt.Sprint("stalled-", i))))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprint("stalled-", i))
			answers[i] = send(req)
		})
	}
	wg.Go(func() {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/payments/"+id, nil)
		answers[n] = send(req)
	})
	wg.Wait()
	// The default request timeout, plus the time to answer on a loaded
	// machine; each request's time less the process's stalls meanwhile
	// (at most those of the whole wait).
	_, stalled := m.Elapsed()
	bound := app.DefaultRequestTimeout + 10*time.Second
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusServiceUnavailable || a.typ != problem.TypeStoreUnavailable || a.retry == "" || a.took-stalled > bound {
			t.Errorf("request %d: %d %s Retry-After %q after %s (less the process's stalls, %s) (err %v); want 503 %s with Retry-After within %s",
				i, a.status, a.typ, a.retry, a.took.Round(time.Millisecond), stalled.Round(time.Millisecond), a.err, problem.TypeStoreUnavailable, bound)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if r := e.post(fmt.Sprint("stalled-", i), paymentBody(fmt.Sprint("stalled-", i))); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("retry %d after the stall: %d replayed=%q %s, want a first 201", i, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
	}
	if got := e.count(); got != n+1 {
		t.Errorf("%d payment rows, want %d", got, n+1)
	}
}
