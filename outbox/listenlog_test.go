package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
)

// listenNotifier is a driver whose listener starts at once and hands its
// onError to the test, which plays its connection failures.
type listenNotifier struct {
	*sqlitedriver.Driver
	onError chan func(error)
}

func (n *listenNotifier) ListenOutbox(_ context.Context, onError func(error)) (<-chan struct{}, error) {
	n.onError <- onError
	return make(chan struct{}), nil
}

// While the database is down, the wake-up listener fails to reconnect
// every 5 s (its backoff's ceiling): the relay logs the first failure at
// once, then at most one line every 30 s with the attempts not logged,
// and one INFO line when it has reconnected. (It logged a WARN for every
// attempt: 720 an hour.)
func TestListenerFailuresLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	buf := &testlog.Buffer{}
	drv := &listenNotifier{Driver: testdb.SQLite(t), onError: make(chan func(error), 1)}
	pub := outbox.PublisherFunc(func(context.Context, []event.Envelope) error { return nil })
	relay, err := outbox.NewRelay(drv, pub, &outbox.RelayConfig{
		PollInterval: time.Hour,
		Now:          clock.Now,
		Logger:       slog.New(slog.NewJSONHandler(buf, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, relay)
	var onError func(error)
	select {
	case onError = <-drv.onError:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not start its listener")
	}
	// Two minutes down: 25 failed attempts, 5 s apart, each with its own
	// port in the text.
	for i := range 25 {
		onError(fmt.Errorf("pgdriver: outbox listen: connect: dial tcp 127.0.0.1:%d: connection refused", 40000+i))
		clock.Add(5 * time.Second)
	}
	onError(nil) // reconnected
	type line struct {
		Level          string `json:"level"`
		Msg            string `json:"msg"`
		Err            string `json:"err"`
		Suppressed     int    `json:"suppressed"`
		FailedAttempts int    `json:"failed_attempts"`
	}
	var lines []line
	for l := range strings.Lines(buf.String()) {
		var ll line
		if err := json.Unmarshal([]byte(l), &ll); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if strings.Contains(ll.Msg, "listener") {
			lines = append(lines, ll)
		}
	}
	// At 0 s, then 30, 60, 90 and 120 s (each with the 5 attempts not
	// logged since), then the reconnection.
	if len(lines) != 6 {
		t.Fatalf("%d listener lines for 25 failed attempts in 2 minutes and a reconnection; want 6:\n%s", len(lines), buf.String())
	}
	if l := lines[0]; l.Level != "WARN" || !strings.Contains(l.Err, "connection refused") || l.Suppressed != 0 {
		t.Errorf("first line %+v; want a WARN with the error", l)
	}
	for i, l := range lines[1:5] {
		if l.Level != "WARN" || l.Suppressed != 5 || l.FailedAttempts != 7+6*i || !strings.Contains(l.Err, "connection refused") {
			t.Errorf("repeat %d: %+v; want a WARN with 5 attempts suppressed and %d failed", i+1, l, 7+6*i)
		}
	}
	if l := lines[5]; l.Level != "INFO" || l.FailedAttempts != 25 {
		t.Errorf("last line %+v; want an INFO that the listener reconnected after 25 failed attempts", l)
	}
}
