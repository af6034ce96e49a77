package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// countingCtx is a cancellable context that is not a *cancelCtx, so
// context.AfterFunc registers through its AfterFunc method: live counts
// the registrations not stopped yet.
type countingCtx struct {
	context.Context // Background: deadline, value
	done            chan struct{}
	live            atomic.Int64
}

func (c *countingCtx) Done() <-chan struct{} { return c.done }
func (c *countingCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}
func (c *countingCtx) AfterFunc(f func()) func() bool {
	c.live.Add(1)
	var stopped atomic.Bool
	go func() {
		<-c.done
		if !stopped.Load() {
			f()
		}
	}()
	return func() bool {
		if stopped.CompareAndSwap(false, true) {
			c.live.Add(-1)
			return true
		}
		return false
	}
}

// A round whose Begin (or claim) fails unregisters what ties its
// transaction to Run's context: during a database outage, rounds fail every
// second or two for hours, and each left a registration (a goroutine, with
// a context of another type) until Run ended.
func TestRoundReleasesCancelHookOnFailure(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	drv, err := pgdriver.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	r, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{NoListen: true, Concurrency: 1,
		Backoff: func(int) time.Duration { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := &countingCtx{Context: context.Background(), done: make(chan struct{})}
	ended := make(chan struct{})
	go func() { _ = r.Run(ctx); close(ended) }()
	time.Sleep(2 * time.Second)
	n := ctx.live.Load()
	close(ctx.done)
	<-ended
	if n > 2 {
		t.Errorf("%d AfterFunc registrations outstanding on Run's context after 2s of failing rounds; want at most the one in flight", n)
	}
}
