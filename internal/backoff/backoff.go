// Package backoff is idem's one implementation of retry pauses: an
// exponential schedule, equal jitter ([d/2, d]), and a sleep that ends early with its
// context or a wake-up signal. Jitter matters after an outage: replicas that
// failed together would otherwise retry together, in lockstep, against a
// database or broker that is just coming back.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Exp is base doubled for each attempt after the first (attempt 1 waits
// base), at most ceiling. An attempt below 1 counts as 1.
func Exp(attempt int, base, ceiling time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 62 {
		return ceiling
	}
	d := base << (attempt - 1)
	if d <= 0 || d > ceiling { // overflow, or past the ceiling
		return ceiling
	}
	return d
}

// Jitter draws a duration uniformly from [d/2, d] ("equal jitter"): unlike
// full jitter ([0, d]) it keeps half of the pause, so a retry never becomes
// a tight loop, and it still spreads replicas over a window as wide as half
// the schedule. Zero or negative d returns d.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits d, or until ctx ends, or until wake (nil: never) receives a
// value, and reports whether ctx is still live. A non-positive d returns at
// once.
func Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	if ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}
