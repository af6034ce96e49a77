package outbox

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// Concurrent rounds failing the same way at once: one is logged, every
// round is counted, and the failure ends once.
func TestFailureLogConcurrentRounds(t *testing.T) {
	t.Parallel()
	var (
		l   failureLog
		at  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		wg  sync.WaitGroup
		mu  sync.Mutex
		hit int
	)
	const workers, rounds = 8, 200
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				if log, _ := l.failed(fmt.Sprintf("dial tcp 10.0.0.5:%d: connection refused", 40000+w*rounds+i), at); log {
					mu.Lock()
					hit++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if hit != 1 {
		t.Errorf("%d rounds logged within the interval; want 1", hit)
	}
	ended := l.published([]string{"dial tcp 10.0.0.5:1: connection refused"}, nil)
	if len(ended) != 1 || ended[0].rounds != workers*rounds {
		t.Errorf("ended %+v; want one failure of %d rounds", ended, workers*rounds)
	}
	if again := l.published([]string{"dial tcp 10.0.0.5:1: connection refused"}, nil); len(again) != 0 {
		t.Errorf("ended again: %+v", again)
	}
}

// No more failures than maxFailureGroups are tracked: the one that failed
// least recently is forgotten.
func TestFailureLogBounded(t *testing.T) {
	t.Parallel()
	var l failureLog
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range maxFailureGroups + 1 {
		if log, _ := l.failed(fmt.Sprintf("event %c failed", 'A'+i), at.Add(time.Duration(i)*time.Second)); !log {
			t.Fatalf("failure %d not logged", i)
		}
	}
	if len(l.groups) != maxFailureGroups {
		t.Errorf("%d failures tracked; want %d", len(l.groups), maxFailureGroups)
	}
	if log, _ := l.failed("event A failed", at.Add(time.Hour)); !log {
		t.Error("the failure forgotten first was not logged again")
	}
}

// With anyText, failures of other texts are repeats of the first (the lag
// query failing while the database is down); ended returns the failures
// as one and forgets them.
func TestFailureLogAnyTextAndEnded(t *testing.T) {
	t.Parallel()
	l := failureLog{anyText: true}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if log, _ := l.failed("connection refused", at); !log {
		t.Fatal("first failure not logged")
	}
	if log, _ := l.failed("the database system is starting up", at.Add(time.Second)); log {
		t.Error("a failure of another text logged within the interval")
	}
	g, ok := l.ended()
	if !ok || g.rounds != 2 || g.err != "connection refused" || !g.first.Equal(at) || !g.last.Equal(at.Add(time.Second)) {
		t.Errorf("ended = %+v, %v; want 2 rounds from the first failure", g, ok)
	}
	if _, ok := l.ended(); ok {
		t.Error("ended again")
	}

	// Grouped by text: ended merges the groups, with the text of the one
	// that failed last.
	var m failureLog
	m.failed("connection refused", at)
	m.failed("the database system is starting up", at.Add(2*time.Second))
	m.failed("connection refused", at.Add(time.Second))
	g, ok = m.ended()
	if !ok || g.rounds != 3 || g.err != "the database system is starting up" || !g.first.Equal(at) || !g.last.Equal(at.Add(2*time.Second)) {
		t.Errorf("ended = %+v, %v; want 3 rounds, from the first failure, with the last text", g, ok)
	}
}

// Storage errors that name an event ("mark event ID failed") are one failure
// whatever the event, as are texts that differ in their digits only; other
// texts are other failures.
func TestFailureClass(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{"outbox: mark event 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b failed: conn closed",
			"outbox: mark event 0190A1B2-FFFF-7E5F-8A9B-ABCDEFABCDEF failed: conn closed"},
		{"outbox: park event 01900000-0000-7000-8000-000000000001: dial tcp 10.0.0.5:41234: connection refused",
			"outbox: park event feedbeef-0000-7000-8000-00000000000a: dial tcp 10.0.0.5:5: connection refused"},
		{"produce to orders: NOT_LEADER 3", "produce to orders: NOT_LEADER 12"},
	}
	for _, p := range same {
		if a, b := failureClass(p[0]), failureClass(p[1]); a != b {
			t.Errorf("failureClass(%q) = %q, failureClass(%q) = %q; want equal", p[0], a, p[1], b)
		}
	}
	other := [][2]string{
		{"produce to orders: TOPIC_AUTHORIZATION_FAILED", "produce to payments: TOPIC_AUTHORIZATION_FAILED"},
		{"outbox: mark event 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b failed: conn closed",
			"outbox: park event 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b: conn closed"},
		{"key deadbeef-cafe failed", "key feedface-cafe failed"}, // not a UUID: letters kept
	}
	for _, p := range other {
		if a, b := failureClass(p[0]), failureClass(p[1]); a == b {
			t.Errorf("failureClass(%q) = failureClass(%q) = %q; want different", p[0], p[1], a)
		}
	}
	if got := failureClass("héllo 12 wörld"); got != "héllo 0 wörld" {
		t.Errorf("failureClass of non-ASCII text = %q", got)
	}
}
