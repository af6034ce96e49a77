package pgsql

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeListener is a connection whose Wait fails with the error sent on
// fail, or blocks until ctx ends.
type fakeListener struct{ fail chan error }

func (l fakeListener) Wait(ctx context.Context) error {
	select {
	case err := <-l.fail:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (fakeListener) Ping(context.Context) error { return nil }

func (fakeListener) Close() {}

// A lost connection is reported, then each failed attempt to connect
// again, then nil once connected: the caller can log the end of an outage.
// A listener that never failed reports nothing.
func TestListenLoopReportsTheReconnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l := fakeListener{fail: make(chan error, 1)}
	refused := errors.New("connection refused")
	attempts := 0
	connect := func(context.Context) (Listener, error) {
		if attempts++; attempts <= 2 {
			return nil, refused
		}
		return l, nil
	}
	reports := make(chan error, 10)
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ListenLoop(ctx, "test", l, connect, wake, func(err error) { reports <- err })
	}()
	next := func() error {
		t.Helper()
		select {
		case err := <-reports:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("nothing reported within 5 s")
			return nil
		}
	}
	l.fail <- errors.New("conn closed")
	if err := next(); err == nil || err.Error() != "test: outbox listen: conn closed" {
		t.Fatalf("first report %v; want the lost connection", err)
	}
	for i := range 2 {
		if err := next(); !errors.Is(err, refused) {
			t.Fatalf("report of attempt %d: %v; want %v", i+1, err, refused)
		}
	}
	if err := next(); err != nil {
		t.Fatalf("report after connecting again: %v; want nil", err)
	}
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up after connecting again")
	}
	cancel()
	<-done
	close(reports)
	for err := range reports {
		t.Errorf("reported %v after the reconnection, with no failure", err)
	}
}
