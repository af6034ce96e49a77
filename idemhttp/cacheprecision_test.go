package idemhttp_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
)

// TestCacheExpiryAtStoredPrecision: the stores keep times to the
// microsecond (PostgreSQL's timestamptz, sqlitedriver's micros), so a
// record committed at a clock reading with nanoseconds expires, in the
// store, up to a microsecond before the clock reading plus TTL. The entry
// the executing instance caches at commit must not outlive the stored
// record: at the stored expiry another instance finds the record expired
// and executes again, and the executing instance must not go on replaying
// the first execution.
func TestCacheExpiryAtStoredPrecision(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		var calls atomic.Int64
		var now atomic.Int64
		start := time.Date(2026, 12, 1, 12, 0, 0, 999, time.UTC) // 999ns past the second
		now.Store(start.UnixNano())
		clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
		ins, _ := b.open(t, cacheConfig(idemhttp.Config{Mode: mode, Now: clock}), cacheHandler(&calls, 10), 2)
		a, other := ins[0], ins[1]
		if rr := send(a.h, "POST", "/pay", "k", `{}`); rr.Code != 201 {
			t.Fatalf("first: %d %s", rr.Code, rr.Body)
		}
		// The stored expiry: start+TTL to the microsecond.
		now.Store(start.Truncate(time.Microsecond).Add(24 * time.Hour).UnixNano())
		if rr := send(other.h, "POST", "/pay", "k", `{}`); rr.Code != 201 || !strings.Contains(rr.Body.String(), `"execution":2`) {
			t.Fatalf("other instance at the stored expiry: %d %v %s, want a second execution", rr.Code, rr.Header(), rr.Body)
		}
		rr := send(a.h, "POST", "/pay", "k", `{}`)
		if strings.Contains(rr.Body.String(), `"execution":1`) {
			t.Fatalf("executing instance at the stored expiry replayed the expired first execution from its cache: %d %s", rr.Code, rr.Body)
		}
		if rr.Header().Get(idemhttp.ReplayedHeader) != "true" || !strings.Contains(rr.Body.String(), `"execution":2`) {
			t.Fatalf("executing instance at the stored expiry: %d %s, want the second execution replayed", rr.Code, rr.Body)
		}
	})
}
