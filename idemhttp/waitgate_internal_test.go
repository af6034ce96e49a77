package idemhttp

import (
	"context"
	"testing"
	"time"
)

// One request per key holds the turn; another key's is free; a wait that
// runs out or a cancelled context gives up; nothing is left in the map.
func TestWaitGates(t *testing.T) {
	var g waitGates
	k, other := cacheKey{"s", "k"}, cacheKey{"s", "other"}
	release, ok := g.acquire(t.Context(), k, time.Second)
	if !ok {
		t.Fatal("first acquire failed")
	}
	if _, ok := g.acquire(t.Context(), k, 20*time.Millisecond); ok {
		t.Fatal("a second request got the turn its key's first holds")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, ok := g.acquire(ctx, k, time.Second); ok {
		t.Fatal("a cancelled request got the turn")
	}
	r2, ok := g.acquire(t.Context(), other, 20*time.Millisecond)
	if !ok {
		t.Fatal("another key waited for this one's turn")
	}
	r2()
	got := make(chan func(), 1)
	go func() {
		r, ok := g.acquire(t.Context(), k, 5*time.Second)
		if !ok {
			r = nil
		}
		got <- r
	}()
	time.Sleep(20 * time.Millisecond)
	release()
	r := <-got
	if r == nil {
		t.Fatal("the waiting request did not get the turn given back")
	}
	r()
	if n := len(g.m); n != 0 {
		t.Fatalf("%d gates left in the map", n)
	}
}
