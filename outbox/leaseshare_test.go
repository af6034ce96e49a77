package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// Two RunOnce calls of one relay at once (a cron flush and a shutdown
// flush) share its lease: the first to end must not release it while the
// other's round still publishes, or a standby relay takes it over and
// publishes the same events at the same time.
func TestSQLiteConcurrentRunOnceKeepTheLease(t *testing.T) {
	t.Parallel()
	a, b := sharedSQLite(t)
	backlog(t, a, 1, 3)
	ctx := t.Context()
	cfg := outbox.RelayConfig{BatchSize: 1, PollInterval: 10 * time.Millisecond}

	rb := newRecorder(0)
	relayB, err := outbox.NewRelay(b, rb.publisher("b"), &cfg)
	if err != nil {
		t.Fatal(err)
	}

	var (
		started1 = make(chan struct{})
		release1 = make(chan struct{})
		done1    = make(chan struct{})
		calls    int
		standbyN int
		standby  error
		owner    string
		ownerErr error
	)
	pubA := outbox.PublisherFunc(func(ctx context.Context, _ []event.Envelope) error {
		calls++ // rounds of one relay never overlap
		switch calls {
		case 1:
			close(started1)
			<-release1
		case 2:
			// The first RunOnce has returned: this round must still
			// hold the lease.
			<-done1
			owner, _, ownerErr = b.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
			standbyN, standby = relayB.RunOnce(ctx)
		}
		return nil
	})
	relayA, err := outbox.NewRelay(a, pubA, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done1)
		if _, err := relayA.RunOnce(ctx); err != nil {
			t.Errorf("first RunOnce: %v", err)
		}
	}()
	<-started1
	_, until0, err := a.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := relayA.RunOnce(ctx)
		second <- err
	}()
	// The second RunOnce has taken the lease (extended it) and waits for
	// the first round.
	waitFor(t, 5*time.Second, "the second RunOnce takes the lease", func() bool {
		_, until, err := a.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
		return err == nil && until.After(until0)
	})
	close(release1)
	if err := <-second; err != nil {
		t.Errorf("second RunOnce: %v", err)
	}
	if ownerErr != nil || owner == "" {
		t.Errorf("while the second RunOnce published, the relay lease was %q (%v); want it held by the relay", owner, ownerErr)
	}
	if standbyN != 0 || !errors.Is(standby, outbox.ErrStandby) {
		t.Errorf("a standby relay's RunOnce while the second round published = %d, %v; want 0, ErrStandby", standbyN, standby)
	}
	if rb.published() > 0 {
		t.Errorf("the standby relay published %d events that relay a was publishing", rb.published())
	}
}

// A RunOnce of a relay whose Run stops meanwhile keeps the lease for its
// round, and the lease is released once both have ended.
func TestSQLiteRunOnceOutlivesRun(t *testing.T) {
	t.Parallel()
	a, b := sharedSQLite(t)
	backlog(t, a, 1, 3)
	ctx := t.Context()
	cfg := outbox.RelayConfig{BatchSize: 1, PollInterval: 10 * time.Millisecond}
	var (
		started  = make(chan struct{})
		runDone  = make(chan struct{})
		calls    int
		owner    string
		ownerErr error
	)
	pub := outbox.PublisherFunc(func(pctx context.Context, _ []event.Envelope) error {
		calls++
		switch calls {
		case 1: // Run's round, until Run stops
			close(started)
			<-pctx.Done()
			return pctx.Err()
		default: // RunOnce's round, once Run has returned
			<-runDone
			owner, _, ownerErr = b.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
		}
		return nil
	})
	relay, err := outbox.NewRelay(a, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	go func() {
		defer close(runDone)
		if err := relay.Run(runCtx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	<-started
	_, until0, err := a.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
	if err != nil {
		t.Fatal(err)
	}
	once := make(chan error, 1)
	go func() {
		_, err := relay.RunOnce(ctx)
		once <- err
	}()
	waitFor(t, 5*time.Second, "RunOnce takes the lease", func() bool {
		_, until, err := a.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName})
		return err == nil && until.After(until0)
	})
	stopRun()
	if err := <-once; err != nil {
		t.Errorf("RunOnce: %v", err)
	}
	if ownerErr != nil || owner == "" {
		t.Errorf("while RunOnce published after Run returned, the relay lease was %q (%v); want it held", owner, ownerErr)
	}
	if _, _, err := a.Locks().LockGet(ctx, &driver.LockGetParams{Name: outbox.RelayLockName}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("relay lease after Run and RunOnce ended: %v; want it released (ErrNotFound)", err)
	}
}
