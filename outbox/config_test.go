package outbox

import (
	"testing"
	"time"
)

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]time.Duration{
		-1:  100 * time.Millisecond,
		0:   100 * time.Millisecond,
		1:   100 * time.Millisecond,
		2:   200 * time.Millisecond,
		5:   1600 * time.Millisecond,
		10:  51200 * time.Millisecond,
		11:  time.Minute,
		64:  time.Minute,
		1e9: time.Minute,
	} {
		if got := DefaultBackoff(attempt); got != want {
			t.Errorf("DefaultBackoff(%d) = %s; want %s", attempt, got, want)
		}
	}
}

func TestRelayConfigDefaults(t *testing.T) {
	t.Parallel()
	c := RelayConfig{}.withDefaults(true)
	if c.BatchSize != 500 || c.BatchBytes != 16<<20 || c.Concurrency != 2 || c.PollInterval != time.Second || c.PublishTimeout != 30*time.Second ||
		c.MaxAttempts != 0 || c.Backoff == nil || c.Logger == nil || c.Now == nil || c.Wake != nil {
		t.Errorf("defaults: %+v", c)
	}
	if got := c.Backoff(3); got != DefaultBackoff(3) {
		t.Errorf("default Backoff(3) = %s", got)
	}
	if c := (RelayConfig{Concurrency: 8}).withDefaults(false); c.Concurrency != 1 {
		t.Errorf("Concurrency without concurrent writers = %d; want 1", c.Concurrency)
	}
	if c := (RelayConfig{Concurrency: 8}).withDefaults(true); c.Concurrency != 8 {
		t.Errorf("Concurrency 8 = %d", c.Concurrency)
	}
}

func TestRelayConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []RelayConfig{
		{BatchSize: -1},
		{BatchBytes: -1},
		{PollInterval: -time.Second},
		{MaxAttempts: -1},
		{PublishTimeout: -time.Second},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("validate(%+v) = nil; want an error", c)
		}
	}
	if err := (RelayConfig{BatchSize: 10, MaxAttempts: 5}).validate(); err != nil {
		t.Errorf("validate of a valid config: %v", err)
	}
}
