package idemhttp

import (
	"context"
	"sync"
	"time"
)

// waitGates lets the duplicates of one in-flight request wait for its
// key's lock in the store one at a time per middleware; the others wait in
// memory for their turn. Waiting in PostgreSQL holds a connection of the
// pool, doing nothing, for up to Config.Wait: a few copies of one slow
// request (a client that retries on its own timeout, or one that sends
// them on purpose) would take the whole pool, and every other principal's
// requests would wait for a connection. Only the contended path uses it.
type waitGates struct {
	mu sync.Mutex
	m  map[cacheKey]*waitGate
}

// waitGate is one key's turn to wait in the store.
type waitGate struct {
	turn chan struct{} // holds a token while a request waits in the store
	refs int           // requests holding or waiting for the turn
}

// acquire waits, for up to wait and while ctx lasts, for k's turn. It
// returns the function that gives the turn back, or false when the wait
// ran out or ctx ended first.
func (g *waitGates) acquire(ctx context.Context, k cacheKey, wait time.Duration) (release func(), ok bool) {
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[cacheKey]*waitGate)
	}
	gate := g.m[k]
	if gate == nil {
		gate = &waitGate{turn: make(chan struct{}, 1)}
		g.m[k] = gate
	}
	gate.refs++
	g.mu.Unlock()
	leave := func() {
		g.mu.Lock()
		if gate.refs--; gate.refs == 0 {
			delete(g.m, k)
		}
		g.mu.Unlock()
	}
	release = func() { <-gate.turn; leave() }
	select {
	case gate.turn <- struct{}{}:
		return release, true
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case gate.turn <- struct{}{}:
		return release, true
	case <-t.C:
	case <-ctx.Done():
	}
	leave()
	return nil, false
}
