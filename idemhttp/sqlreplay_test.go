package idemhttp_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// Concurrent retries of a completed request, on three replicas (no replay
// cache: each one reads the store), with NoWait: every one is answered
// with its replay. pgsqldriver's claim takes the key's lock for a moment
// even to replay: a retry finding it taken by another retry answered 409
// request-in-progress for a request completed long before (116 of 150).
func TestConcurrentReplaysNoWait(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"pgsqldriver", "pgdriver"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			drv, schema := testdb.PostgresSQLSchema(t)
			e := sqlEnvWith(t, drv, drv.DB(), false)
			if name == "pgdriver" {
				pg, err := pgdriver.New(testdb.Pool(t, schema, 10), &pgdriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				e = pgEnvOn(t, pg)
			}
			var calls atomic.Int64
			cfg := func() *idemhttp.Config {
				return &idemhttp.Config{Wait: idemhttp.NoWait, ReplayCacheBytes: idemhttp.NoReplayCache}
			}
			if rr := send(e.wrap(t, cfg(), effectHandler(t, e, 201, &calls)), "POST", "/pay?label=c", "one-key", `{"amount":"1.00"}`); rr.Code != 201 {
				t.Fatalf("first request: %d %s", rr.Code, rr.Body)
			}
			var replicas []http.Handler
			for range 3 {
				replicas = append(replicas, e.wrap(t, cfg(), effectHandler(t, e, 201, &calls)))
			}
			notReplayed := 0
			for range 5 {
				for _, rr := range hammer(30, replicas...) {
					if rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
						notReplayed++
					}
				}
			}
			if notReplayed > 0 || calls.Load() != 1 {
				t.Fatalf("%d of 150 concurrent retries of a completed request not answered with its replay; handler calls %d, want 1", notReplayed, calls.Load())
			}
		})
	}
}
