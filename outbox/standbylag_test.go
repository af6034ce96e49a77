package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// A relay standing by on SQLite reports the outbox's lag too: its gauge
// must not keep, for as long as it stands by, the value it reported when
// it last published (an alert on lag fired for ever from the replica that
// lost its lease during an outage), nor stay unset while events wait.
func TestSQLiteStandbyReportsLag(t *testing.T) {
	t.Parallel()
	a, b := sharedSQLite(t)
	cfg := outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Backoff: func(int) time.Duration { return time.Hour }}
	down := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return errDown })
	runRelay(t, a, down, cfg)
	backlog(t, a, 1, 1)
	// a holds the lease and fails to publish: the event waits.
	var lag atomic.Int64
	lag.Store(-1)
	cfg.OnLag = func(d time.Duration) { lag.Store(int64(d)) }
	up := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	waitFor(t, 5*time.Second, "relay a takes the lease", func() bool {
		_, _, err := a.Locks().LockGet(t.Context(), &driver.LockGetParams{Name: outbox.RelayLockName})
		return err == nil
	})
	runRelay(t, b, up, cfg)
	waitFor(t, 5*time.Second, "the standby relay reports the lag of the waiting event", func() bool {
		return lag.Load() > 0
	})
}
