package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// fakeClock is a RelayConfig.Now that the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// logLine is a line of a slog JSON handler.
type logLine struct {
	Level        string  `json:"level"`
	Msg          string  `json:"msg"`
	Err          string  `json:"err"`
	Suppressed   int     `json:"suppressed"`
	FailedRounds int     `json:"failed_rounds"`
	Over         float64 `json:"over"` // nanoseconds
	// Storage failures (see storagelog_test.go).
	ConsecutiveFailures int     `json:"consecutive_failures"`
	RetryIn             float64 `json:"retry_in"` // nanoseconds
	FailedQueries       int     `json:"failed_queries"`
	OKRounds            int     `json:"ok_rounds"`
}

func logLines(t *testing.T, buf *testlog.Buffer) []logLine {
	t.Helper()
	var lines []logLine
	for l := range strings.Lines(buf.String()) {
		var ll logLine
		if err := json.Unmarshal([]byte(l), &ll); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, ll)
	}
	return lines
}

// A destination that keeps failing while other keys flow, one round a
// second for 70 s: the failure is logged once at once, then summarised
// every 30 s with the number of rounds not logged, and its end is logged
// once an event that failed with it is published. RunOnce's errors are
// those of every failed round.
func TestRelayLogsARepeatedFailureOnce(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) { testRepeatedFailureLog(t, testdb.SQLite(t)) })
	t.Run("PostgreSQL", func(t *testing.T) { testRepeatedFailureLog(t, testdb.Postgres(t)) })
}

func testRepeatedFailureLog[TTx any](t *testing.T, drv driver.OutboxDriver[TTx]) {
	t.Parallel()
	const failedRounds = 70
	var (
		logs  testlog.Buffer
		clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		mu    sync.Mutex
		round int
	)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(es))
		failed := false
		for i, e := range es {
			if e.Key == "denied" && round < failedRounds {
				// The local port changes from one attempt to the next:
				// still the same failure.
				errs[i] = fmt.Errorf("produce to orders: dial tcp 10.0.0.5:%d->10.0.0.9:9092: TOPIC_AUTHORIZATION_FAILED", 40000+round)
				failed = true
			}
		}
		round++
		if !failed {
			return nil
		}
		return &outbox.PublishError{Errs: errs}
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 0 }, // due again at once
		Now:     clock.Now,
		Logger:  slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueueTx(t, drv, mustEvent(t, "denied"))
	for i := range failedRounds + 1 {
		enqueueTx(t, drv, mustEvent(t, fmt.Sprintf("flowing-%d", i)))
		n, err := relay.RunOnce(t.Context())
		if i < failedRounds {
			if err == nil || n != 1 {
				t.Fatalf("round %d: RunOnce = %d, %v; want 1 published and the denied event's error", i, n, err)
			}
		} else if err != nil || n != 2 {
			t.Fatalf("round %d: RunOnce = %d, %v; want both events published", i, n, err)
		}
		clock.Add(time.Second)
	}

	lines := logLines(t, &logs)
	var warns, summaries, recoveries []logLine
	for _, l := range lines {
		switch {
		case l.Level == "WARN" && strings.HasPrefix(l.Msg, "outbox: publish failed"):
			warns = append(warns, l)
		case l.Level == "WARN" && strings.HasPrefix(l.Msg, "outbox: publish still failing"):
			summaries = append(summaries, l)
		case l.Level == "INFO" && l.Msg == "outbox: published again after failed rounds":
			recoveries = append(recoveries, l)
		default:
			t.Errorf("unexpected log line %+v", l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0].Err, "TOPIC_AUTHORIZATION_FAILED") {
		t.Errorf("%d first warnings (%+v); want 1, with the error", len(warns), warns)
	}
	// Rounds at 0..69 s: warned at 0, summaries at 30 and 60 s of the 29
	// rounds in between; the 9 rounds after 60 s are in the recovery's
	// count.
	if len(summaries) != 2 {
		t.Fatalf("%d summaries (%+v); want 2, at 30 and 60 s", len(summaries), summaries)
	}
	for i, s := range summaries {
		if s.Suppressed != 29 || s.FailedRounds != 30*(i+1)+1 || !strings.Contains(s.Err, "TOPIC_AUTHORIZATION_FAILED") {
			t.Errorf("summary %d: %+v; want 29 suppressed, %d failed rounds and the error", i, s, 30*(i+1)+1)
		}
	}
	if len(recoveries) != 1 {
		t.Fatalf("%d recovery lines (%+v); want 1", len(recoveries), recoveries)
	}
	if r := recoveries[0]; r.FailedRounds != failedRounds || time.Duration(r.Over) != failedRounds*time.Second {
		t.Errorf("recovery: %+v; want %d failed rounds over %s", r, failedRounds, failedRounds*time.Second)
	}
}

// Two failures (two topics denied) are two first warnings; a failure not
// seen for 5 minutes is forgotten, with a line saying so, and logged at
// once when it comes back.
func TestRelayLogsEachFailureAndForgetsOldOnes(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	var (
		logs  testlog.Buffer
		clock = &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	)
	pub := outbox.PublisherFunc(func(_ context.Context, es []event.Envelope) error {
		errs := make([]error, len(es))
		for i, e := range es {
			errs[i] = errors.New("produce to " + e.Key + ": TOPIC_AUTHORIZATION_FAILED")
		}
		return &outbox.PublishError{Errs: errs}
	})
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		Backoff: func(int) time.Duration { return 0 },
		Now:     clock.Now,
		Logger:  slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueueTx(t, drv, mustEvent(t, "orders"), mustEvent(t, "payments"))
	for range 3 {
		if _, err := relay.RunOnce(t.Context()); err == nil {
			t.Fatal("RunOnce succeeded; want the denied events' error")
		}
		clock.Add(time.Second)
	}
	lines := logLines(t, &logs)
	if len(lines) != 2 || lines[0].Err != "produce to orders: TOPIC_AUTHORIZATION_FAILED" || lines[1].Err != "produce to payments: TOPIC_AUTHORIZATION_FAILED" {
		t.Fatalf("after 3 rounds with two topics denied: %+v; want one warning per topic", lines)
	}

	// 5 minutes without a round (a relay stopped, say): the next round
	// first forgets both failures, with a line each, then fails with both
	// again, each logged at once as a new failure.
	clock.Add(5 * time.Minute)
	if _, err := relay.RunOnce(t.Context()); err == nil {
		t.Fatal("RunOnce succeeded; want the denied events' error")
	}
	lines = logLines(t, &logs)[2:]
	var quiet, warns int
	for _, l := range lines {
		switch {
		case l.Level == "INFO" && strings.HasPrefix(l.Msg, "outbox: publish failure no longer seen") && l.FailedRounds == 3:
			quiet++
		case l.Level == "WARN" && strings.HasPrefix(l.Msg, "outbox: publish failed"):
			warns++
		default:
			t.Errorf("unexpected log line %+v", l)
		}
	}
	if quiet != 2 || warns != 2 {
		t.Errorf("after 5 quiet minutes: %d lines forgetting a failure, %d warnings (%+v); want 2 and 2", quiet, warns, lines)
	}
}
