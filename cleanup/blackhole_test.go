package cleanup_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/cleanup"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/internal/testdb"
)

// A sweep whose lease acquisition is sent on a pooled connection that the
// network black-holes (a partition that resets nothing: a failover behind
// a load balancer or NAT, a firewall that lost its state) fails within a
// third of the lease, logged and reported like any failed sweep, instead
// of waiting as long as TCP does (for ever behind this proxy, which
// acknowledges; about 15 min otherwise), with no sweep run meanwhile; the
// next sweep, on another connection, deletes what is due.
func TestSweepGivesUpABlackHoledLeaseAcquisition(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 2)
	direct, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	proxy := testdb.NewProxy(t)
	drv, err := pgdriver.New(proxy.Pool(t, schema, 2), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	clRecords(t, direct.Executor(), "old", 5, now.Add(-30*24*time.Hour), now.Add(-29*24*time.Hour))
	cfg := clConfig(fixedClock(now))
	cfg.Lease = 3 * time.Second
	c := newCleaner(t, drv, cfg)

	f := proxy.Arm(testdb.BlackHole, func(b []byte) bool { return bytes.Contains(b, []byte("idem_lock")) })
	t.Cleanup(f.Cut)
	type result struct {
		rep cleanup.Report
		err error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		rep, err := c.RunOnce(context.WithoutCancel(t.Context()))
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		t.Logf("the sweep failed %s after it started: %v", time.Since(started).Round(time.Millisecond), r.err)
		if r.err == nil {
			t.Fatal("RunOnce succeeded on a black-holed connection")
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("RunOnce still waited on its black-holed lease acquisition after 15 s (Lease %s)", cfg.Lease)
	}
	select {
	case <-f.Fired():
	default:
		t.Fatal("the fault did not fire")
	}
	rep := runOnce(t, c)
	wantDeleted(t, rep, "idempotency_record", 5)
}
