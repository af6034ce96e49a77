package flaplog

import (
	"testing"
	"time"
)

// A failure that flips every 100 ms for 2 minutes is three lines a minute
// or so: the start, a summary every 30 s with the counts, and the end once
// 10 s went by without a failure.
func TestFlappingFailureIsSummarised(t *testing.T) {
	var l Limiter
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var lines []Action
	var last Episode
	now := t0
	for i := range 1200 {
		now = t0.Add(time.Duration(i) * 100 * time.Millisecond)
		var a Action
		var ep Episode
		if i%2 == 0 {
			a, ep = l.Failed(now)
		} else {
			a, ep = l.Succeeded(now)
		}
		if a != None {
			lines, last = append(lines, a), ep
		}
	}
	want := []Action{Start, Summary, Summary, Summary}
	if len(lines) != len(want) {
		t.Fatalf("lines %v; want %v", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Fatalf("lines %v; want %v", lines, want)
		}
	}
	if last.Suppressed != 149 || last.Failures != 451 || last.Successes != 450 {
		t.Errorf("last summary %+v; want 149 suppressed, 451 failures, 450 successes (at 90 s)", last)
	}
	// Successes only: the end after Quiet, once.
	var ends int
	for i := range 200 {
		now = now.Add(100 * time.Millisecond)
		if a, ep := l.Succeeded(now); a == End {
			ends++
			if ep.Failures != 600 || now.Sub(ep.Last) < Quiet || ep.Successes != 699 {
				t.Errorf("end %+v at %s", ep, now)
			}
		} else if a != None {
			t.Errorf("success %d: %v", i, a)
		}
	}
	if ends != 1 {
		t.Errorf("%d ends; want 1", ends)
	}
	// A new failure starts a new episode.
	if a, ep := l.Failed(now); a != Start || ep.Failures != 1 {
		t.Errorf("failure after the end: %v %+v; want Start", a, ep)
	}
}
