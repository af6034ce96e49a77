package outbox_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// A relay that could not reach the lease logs an error, and logs when it
// can again: the error must not be the last word on a relay that publishes.
func TestSQLiteLeaseUnavailableThenBack(t *testing.T) {
	t.Parallel()
	a, _ := sharedSQLite(t)
	var fail atomic.Bool
	fail.Store(true)
	var logs testlog.Buffer
	published := make(chan struct{}, 1)
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error {
		select {
		case published <- struct{}{}:
		default:
		}
		return nil
	})
	cfg := outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	runRelay(t, cutOffDriver{Driver: a, locks: failingLocks{LockExecutor: a.Locks(), fail: &fail}}, pub, cfg)
	waitFor(t, 5*time.Second, "the relay logs that the lease is unavailable", func() bool {
		for _, l := range logLines(t, &logs) {
			if l.Level == "ERROR" && l.Msg == "outbox: relay lease unavailable; not publishing" {
				return true
			}
		}
		return false
	})
	fail.Store(false)
	backlog(t, a, 1, 1)
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay does not publish once the lease is reachable")
	}
	var back bool
	for _, l := range logLines(t, &logs) {
		if l.Level == "INFO" && l.Msg == "outbox: relay lease available again; publishing" && l.ConsecutiveFailures > 0 {
			back = true
		}
	}
	if !back {
		t.Errorf("no INFO line says the relay lease is available again after the error; lines:\n%s", logs.String())
	}
}
