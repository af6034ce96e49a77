package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/event"
	"github.com/idemkit/idem/outbox"
)

// fakeLate is a LatePublisher that succeeds, after running during (a
// freeze of the process while the broker acknowledges, say).
type fakeLate struct {
	calls  int
	during func()
	late   func(late func(int, error))
}

func (f *fakeLate) Publish(context.Context, []event.Envelope) error {
	f.calls++
	if f.during != nil {
		f.during()
	}
	return nil
}

func (f *fakeLate) PublishLate(ctx context.Context, events []event.Envelope, late func(int, error)) error {
	err := f.Publish(ctx, events)
	if f.late != nil {
		f.late(late)
	}
	return err
}

// TestFencedPublisher: the relay's publisher into the embedded broker
// publishes only while the broker's lease surely holds, and does not report
// as published what the broker acknowledged after that stopped being so
// (the process was frozen past its lease, which an idemd elsewhere may
// have taken: the events went into a log no consumer reads any more).
func TestFencedPublisher(t *testing.T) {
	e, err := event.New("Probe.v1", "k", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	events := []event.Envelope{e, e}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := start
	l := &lease{}
	l.validUntil.Store(start.Add(embeddedLockTTL).UnixNano())
	inner := &fakeLate{}
	p := &fencedPublisher{pub: inner, lease: l, now: func() time.Time { return now }}
	ctx := context.Background()
	skippedAll := func(t *testing.T, err error) {
		t.Helper()
		var pe *outbox.PublishError
		if !errors.As(err, &pe) || len(pe.Errs) != len(events) {
			t.Fatalf("got %v, want a PublishError for %d events", err, len(events))
		}
		for i, e := range pe.Errs {
			if !errors.Is(e, outbox.ErrSkipped) || !errors.Is(e, errLeaseUnsure) {
				t.Errorf("event %d: %v, want skipped for an unsure lease", i, e)
			}
		}
	}

	// Renewed 0 to 10 s ago: publishes.
	for _, d := range []time.Duration{0, embeddedLockTTL - embeddedPublishGuard - time.Millisecond} {
		now = start.Add(d)
		if err := p.Publish(ctx, events); err != nil {
			t.Fatalf("lease valid for %v more: %v", embeddedLockTTL-d, err)
		}
	}
	// Renewals failed for 10 s, or the process was frozen past its
	// lease: the broker is not even asked.
	calls := inner.calls
	for _, d := range []time.Duration{embeddedLockTTL - embeddedPublishGuard, embeddedLockTTL + time.Second, time.Hour} {
		now = start.Add(d)
		skippedAll(t, p.Publish(ctx, events))
		skippedAll(t, p.PublishLate(ctx, events, func(int, error) { t.Error("late outcome of an event not published") }))
	}
	if inner.calls != calls {
		t.Errorf("the broker was asked %d times with the lease unsure", inner.calls-calls)
	}

	// Frozen while the broker acknowledged: not reported published.
	now = start
	inner.during = func() { now = start.Add(embeddedLockTTL + 5*time.Second) }
	skippedAll(t, p.Publish(ctx, events))
	now = start
	skippedAll(t, p.PublishLate(ctx, events, func(int, error) {}))
	inner.during = nil

	// A late outcome "published" learned once the lease is unsure is
	// reported not published.
	now = start
	var got []error
	inner.late = func(late func(int, error)) {
		now = start.Add(embeddedLockTTL)
		late(0, nil)
		late(1, errors.New("broker down"))
	}
	skippedAll(t, p.PublishLate(ctx, events, func(i int, err error) { got = append(got, err) }))
	if len(got) != 2 || !errors.Is(got[0], errLeaseUnsure) || errors.Is(got[1], errLeaseUnsure) {
		t.Errorf("late outcomes %v, want the first not published (lease unsure), the second as the broker said", got)
	}
}
