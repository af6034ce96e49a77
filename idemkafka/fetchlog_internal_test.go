package idemkafka

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testlog"
)

// The group's failures are one, whatever their text: the first is logged,
// repeats within groupFailureLogInterval are counted, the next repeat after
// it is logged with the count, and joining ends the failure.
func TestGroupFailures(t *testing.T) {
	t.Parallel()
	refused := &kgo.ErrGroupSession{Err: errors.New("dial tcp 127.0.0.1:9092: connect: connection refused")}
	timeout := &kgo.ErrGroupSession{Err: errors.New("i/o timeout")}
	if !isGroupFailure("", refused) || isGroupFailure("orders", refused) || isGroupFailure("", errors.New("fetch response is larger than BrokerMaxReadBytes")) {
		t.Fatal("isGroupFailure: want only a group session error of no topic")
	}

	var g groupFailures
	if _, ok := g.joined(); ok {
		t.Fatal("joined without a failure reports one")
	}
	t0 := time.Unix(1000, 0)
	if log, s := g.failed(refused, t0); !log || s.failures != 1 {
		t.Fatalf("first failure: log %v, %+v; want logged, failures 1", log, s)
	}
	for i := 1; i <= 10; i++ {
		if log, _ := g.failed(timeout, t0.Add(time.Duration(i)*2*time.Second)); log {
			t.Fatalf("repeat %d within %v logged", i, groupFailureLogInterval)
		}
	}
	log, s := g.failed(refused, t0.Add(groupFailureLogInterval))
	if !log || s.failures != 12 || s.suppressed != 10 || !s.first.Equal(t0) || !errors.Is(s.err, refused) {
		t.Fatalf("repeat after %v: log %v, %+v; want logged, failures 12, suppressed 10, since t0", groupFailureLogInterval, log, s)
	}
	if log, _ := g.failed(refused, t0.Add(groupFailureLogInterval+time.Second)); log {
		t.Fatal("repeat right after a logged one logged")
	}
	s, ok := g.joined()
	if !ok || s.failures != 13 || !s.first.Equal(t0) {
		t.Fatalf("joined: %v, %+v; want the failure of 13 tries since t0", ok, s)
	}
	if log, s := g.failed(timeout, t0.Add(time.Hour)); !log || s.failures != 1 {
		t.Fatalf("failure after the join: log %v, %+v; want a new first failure", log, s)
	}
}

// A partition's fetch failures: the first is logged, repeats within
// groupFailureLogInterval are counted, the next after it is logged with
// the count; another partition's are its own; a failure after a quiet
// groupFailureLogInterval is a new one.
func TestPartitionFailures(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	c := &Consumer[struct{}]{cfg: ConsumerConfig[struct{}]{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}
	oor := errors.New("OFFSET_OUT_OF_RANGE")
	t0 := time.Unix(1000, 0)
	lines := func() int { return strings.Count(logs.String(), "\n") }
	c.logPartitionFailure("orders", 0, oor, t0)
	c.logPartitionFailure("orders", 1, oor, t0)
	for i := 1; i <= 10; i++ {
		c.logPartitionFailure("orders", 0, oor, t0.Add(time.Duration(i)*time.Second))
	}
	if n := lines(); n != 2 {
		t.Fatalf("%d lines; want the first failure of each partition:\n%s", n, logs.String())
	}
	c.logPartitionFailure("orders", 0, oor, t0.Add(groupFailureLogInterval))
	if n := lines(); n != 3 || !strings.Contains(logs.String(), "still failing") || !strings.Contains(logs.String(), "suppressed=10 failures=12") {
		t.Fatalf("want a line with suppressed=10 failures=12:\n%s", logs.String())
	}
	c.logPartitionFailure("orders", 1, oor, t0.Add(time.Hour)) // quiet since t0: a new failure
	if n := lines(); n != 4 || strings.Count(logs.String(), `msg="idemkafka: fetch failed"`) != 3 {
		t.Fatalf("want a new failure logged as the first:\n%s", logs.String())
	}
}
