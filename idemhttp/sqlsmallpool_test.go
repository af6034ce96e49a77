package idemhttp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// Concurrent duplicates on a database/sql pool of one or two connections
// (the effect written in the middleware's transaction): one execution,
// the others replay it, none waits for ever (a duplicate waiting for the
// key's lock holds a connection, the others wait for one).
func TestSQLSmallPoolDuplicates(t *testing.T) {
	t.Parallel()
	for _, conns := range []int{1, 2} {
		t.Run(fmt.Sprint(conns), func(t *testing.T) {
			t.Parallel()
			_, schema := testdb.PostgresSQLSchema(t)
			db := testdb.SQLPool(t, schema, conns)
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			e := sqlEnvWith(t, drv, db, false)
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{Wait: 20 * time.Second}, slowEffect(t, e, &calls, 200*time.Millisecond))
			done := make(chan struct{})
			go func() {
				defer close(done)
				checkExactlyOnce(t, e, &calls, hammer(10, h), false)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("10 duplicates on a pool of %d connections not answered within 30s: %+v", conns, db.Stats())
			}
		})
	}
}

// The client goes away after the handler returned and before the record is
// stored: database/sql rolls the transaction back as its context (the
// request's) ends. CommitComplete says so (ErrTxDone, not an unknown
// outcome): nothing applied, reported OutcomeNotStored, no "commit result
// unknown" error logged, and the retry executes once. (pgdriver commits
// there: its transaction does not end with the request's context.)
func TestSQLClientGoneBeforeCommitComplete(t *testing.T) {
	t.Parallel()
	drv := testdb.PostgresSQL(t)
	e := sqlEnvWith(t, drv, drv.DB(), false)
	for i := range 20 {
		key := fmt.Sprint("gone-", i)
		ctx, cancel := context.WithCancel(t.Context())
		var logs syncBuffer
		var outcome atomic.Value
		var calls atomic.Int64
		h := e.wrap(t, &idemhttp.Config{
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			// Asked once the handler returned, the transaction open.
			Store:     func(status int) bool { cancel(); return status < 500 },
			OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outcome.Store(o) },
		}, effectHandler(t, e, 201, &calls))
		req := httptest.NewRequestWithContext(ctx, "POST", "/pay?label="+key, strings.NewReader(`{}`))
		req.Header.Set(idemhttp.KeyHeader, key)
		h.ServeHTTP(httptest.NewRecorder(), req)
		if o, _ := outcome.Load().(idemhttp.Outcome); o != idemhttp.OutcomeNotStored {
			t.Fatalf("%s: outcome %v, want OutcomeNotStored; log:\n%s", key, o, logs.String())
		}
		if strings.Contains(logs.String(), "commit result unknown") {
			t.Fatalf("%s: logged an unknown outcome for a transaction rolled back by database/sql:\n%s", key, logs.String())
		}
		if n := e.effects(t, key); n != 0 {
			t.Fatalf("%s: effects = %d after the client went, want 0", key, n)
		}
		if rr := send(h, "POST", "/pay?label="+key, key, `{}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("%s: retry %d %s; want it executed", key, rr.Code, rr.Body)
		}
		if n := e.effects(t, key); n != 1 {
			t.Fatalf("%s: effects = %d after the retry, want 1", key, n)
		}
	}
}
