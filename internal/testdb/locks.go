package testdb

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitForAdvisoryWaiter returns once some session waits for an advisory
// lock that the session of backend PID holder has been granted, polling
// pg_locks through pool for up to 30 s. It fails the test if done yields
// first (the call that should have waited returned; what is named in the
// failure) or if nothing waits by then.
func WaitForAdvisoryWaiter(ctx context.Context, t testing.TB, pool *pgxpool.Pool, holder int, done <-chan error, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks w JOIN pg_locks h
			ON h.locktype = 'advisory' AND h.granted AND h.pid = $1
			AND (w.classid, w.objid, w.objsubid) = (h.classid, h.objid, h.objsubid)
			WHERE w.locktype = 'advisory' AND NOT w.granted)`, holder).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("%s returned %v while the lock was held", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for the lock", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
