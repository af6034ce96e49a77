package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

func TestExp(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		attempt int
		want    time.Duration
	}{{-1, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {5, 1600 * time.Millisecond},
		{8, 10 * time.Second}, {63, 10 * time.Second}, {1000, 10 * time.Second}} {
		if got := backoff.Exp(tt.attempt, 100*time.Millisecond, 10*time.Second); got != tt.want {
			t.Errorf("Exp(%d) = %s, want %s", tt.attempt, got, tt.want)
		}
	}
}

// Jitter spreads retries over [d/2, d]: never above, never below half, and
// not the same value for every caller.
func TestJitter(t *testing.T) {
	t.Parallel()
	d := time.Second
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := backoff.Jitter(d)
		if j < d/2 || j > d {
			t.Fatalf("Jitter(%s) = %s, outside [%s, %s]", d, j, d/2, d)
		}
		seen[j] = true
	}
	if len(seen) < 900 {
		t.Errorf("Jitter gave %d distinct values in 1000 draws: replicas would retry in lockstep", len(seen))
	}
	if backoff.Jitter(0) != 0 {
		t.Error("Jitter(0) != 0")
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	start := time.Now()
	if !backoff.Sleep(context.Background(), time.Hour, wake) || time.Since(start) > time.Minute { // far from the hour; a loaded machine stalls a process for seconds
		t.Error("a wake-up did not end the sleep")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if backoff.Sleep(ctx, time.Hour, nil) {
		t.Error("Sleep on an ended context reported it live")
	}
	if !backoff.Sleep(context.Background(), 10*time.Millisecond, nil) {
		t.Error("a timed sleep reported the context dead")
	}
}
