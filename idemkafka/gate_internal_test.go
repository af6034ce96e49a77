package idemkafka

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A caller producing alone waits for the shared ones in progress and holds
// back new ones; one that gives up (its ctx ends) lets them go on.
func TestGate(t *testing.T) {
	t.Parallel()
	var g gate
	ctx := t.Context()
	if err := g.enter(ctx, false); err != nil {
		t.Fatal(err)
	}
	entered := make(chan error, 1)
	go func() { entered <- g.enter(ctx, true) }()
	waitUntil(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.waiting == 1 })

	// A new shared caller waits behind the one waiting to be alone.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.enter(short, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shared enter while a caller waits to be alone = %v; want the deadline", err)
	}
	g.leave(false)
	if err := <-entered; err != nil {
		t.Fatalf("alone enter = %v", err)
	}
	shared := make(chan error, 1)
	go func() { shared <- g.enter(ctx, false) }()
	select {
	case err := <-shared:
		t.Fatalf("shared enter while a caller is alone returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.leave(true)
	if err := <-shared; err != nil {
		t.Fatalf("shared enter after the alone caller left = %v", err)
	}

	// An alone caller that gives up releases the shared callers it held
	// back.
	actx, acancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- g.enter(actx, true) }()
	waitUntil(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.waiting == 1 })
	go func() { shared <- g.enter(ctx, false) }()
	acancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("alone enter with its ctx cancelled = %v", err)
	}
	if err := <-shared; err != nil {
		t.Fatalf("shared enter after the alone caller gave up = %v", err)
	}
	g.leave(false)
	g.leave(false)
	if g.shared != 0 || g.alone || g.waiting != 0 {
		t.Fatalf("gate left as %+v", &g)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}
