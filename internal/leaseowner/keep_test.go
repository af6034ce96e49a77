package leaseowner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// A renewal that fails at once (its connection found dead) is retried
// within a fraction of a second, not an interval later: three failing in
// a row cost the lease nothing. They used to cost all of it (renewals at
// Lease/3, 2Lease/3 and Lease failed, and the holder stopped).
func TestKeepRetriesAFailedRenewalPromptly(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	var (
		mu sync.Mutex
		at []time.Time
	)
	start := time.Now()
	ctx, stop := Keep(context.Background(), Keeper{
		Lease: lease,
		Now:   time.Now,
		Renew: func(context.Context, time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			if len(at) <= 3 {
				return errors.New("conn closed")
			}
			return nil
		},
		What: "test: lease", Name: "l", Other: "another",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, start.Add(lease))
	defer stop()
	select {
	case <-ctx.Done():
		t.Fatalf("the lease was given up after %s: %v", time.Since(start).Round(time.Millisecond), context.Cause(ctx))
	case <-time.After(lease + lease/3):
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) < 4 {
		t.Fatalf("%d renewals attempted, want the 3 failed and one that succeeded", len(at))
	}
	for i := 1; i < 4; i++ {
		if d := at[i].Sub(at[i-1]); d > lease/4 {
			t.Errorf("renewal %d came %s after the failed one, want within %s (not the interval, %s)", i+1, d, lease/4, lease/3)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		failed   int
		interval time.Duration
		want     time.Duration
	}{
		{1, 10 * time.Second, 100 * time.Millisecond},
		{2, 10 * time.Second, 200 * time.Millisecond},
		{4, 10 * time.Second, 800 * time.Millisecond},
		{8, 10 * time.Second, 10 * time.Second},
		{100, 10 * time.Second, 10 * time.Second},
		{1, 50 * time.Millisecond, 50 * time.Millisecond},
	} {
		if got := RetryDelay(c.failed, c.interval); got != c.want {
			t.Errorf("RetryDelay(%d, %s) = %s, want %s", c.failed, c.interval, got, c.want)
		}
	}
}
