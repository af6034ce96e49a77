package txbegin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem/internal/txbegin"
)

func TestBegin(t *testing.T) {
	t.Run("no stop", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var got context.Context
		tx, end, err := txbegin.Begin(ctx, func(ctx context.Context) (int, error) { got = ctx; return 7, nil }, func(int) { t.Error("rolled back") })
		defer end()
		if tx != 7 || err != nil || got != ctx {
			t.Fatalf("Begin = %d, %v (ctx passed through: %v); want 7, nil, true", tx, err, got == ctx)
		}
		cancel()
	})
	t.Run("stop after begin leaves the transaction alive", func(t *testing.T) {
		stop, cancel := context.WithCancel(context.Background())
		work := txbegin.WithStop(context.WithoutCancel(stop), stop)
		var txCtx context.Context
		_, end, err := txbegin.Begin(work, func(ctx context.Context) (int, error) { txCtx = ctx; return 1, nil }, func(int) { t.Error("rolled back") })
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if txCtx.Err() != nil {
			t.Fatal("the transaction's context ended with stop; want it alive until end")
		}
		end()
		if txCtx.Err() == nil {
			t.Fatal("the transaction's context is alive after end")
		}
	})
	t.Run("stop while begin waits", func(t *testing.T) {
		stop, cancel := context.WithCancel(context.Background())
		work := txbegin.WithStop(context.WithoutCancel(stop), stop)
		rolledBack := false
		_, end, err := txbegin.Begin(work, func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done() // waits for a connection until cancelled
			return 0, ctx.Err()
		}, func(int) { rolledBack = true })
		end()
		if !errors.Is(err, context.Canceled) || rolledBack {
			t.Fatalf("Begin: %v (rolled back: %v); want context.Canceled and nothing to roll back", err, rolledBack)
		}
	})
	t.Run("stop as begin returns a transaction", func(t *testing.T) {
		stop, cancel := context.WithCancel(context.Background())
		work := txbegin.WithStop(context.WithoutCancel(stop), stop)
		rolledBack := 0
		_, end, err := txbegin.Begin(work, func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done()
			return 5, nil // begun all the same
		}, func(tx int) { rolledBack = tx })
		end()
		if !errors.Is(err, context.Canceled) || rolledBack != 5 {
			t.Fatalf("Begin: %v, rolled back %d; want context.Canceled and the transaction (5) rolled back", err, rolledBack)
		}
	})
}

func TestStop(t *testing.T) {
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := txbegin.WithStop(context.WithoutCancel(stop), stop)
	if s, ok := txbegin.Stop(work); !ok || s != stop {
		t.Fatal("Stop(work) is not the stop context WithStop marked it with")
	}
	if s, ok := txbegin.Stop(context.Background()); ok || s != nil {
		t.Fatalf("Stop of an unmarked context = %v, %v; want nil, false", s, ok)
	}
}
