package idemkafka

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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
