package idemhttp_test

import (
	"fmt"
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
