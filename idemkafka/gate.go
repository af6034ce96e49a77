package idemkafka

import (
	"context"
	"sync"
)

// gate lets the Publish calls of a Publisher produce at the same time
// (shared) or one of them produce with no other record of the publisher in
// its client (alone). kgo puts the records of concurrent calls for one
// partition into one record batch and fails them all when the broker
// refuses it, so a record is only known to be refused for itself when it
// was produced alone. A caller waiting to produce alone holds back new
// shared callers, so that it is not starved by overlapping ones.
type gate struct {
	mu      sync.Mutex
	shared  int           // callers producing together
	alone   bool          // a caller produces alone
	waiting int           // callers waiting to produce alone
	changed chan struct{} // closed at the next release, nil if none waits
}

// enter waits until the caller may produce (alone if alone is set), or
// until ctx ends. Every nil return must be followed by a leave with the
// same alone.
func (g *gate) enter(ctx context.Context, alone bool) error {
	g.mu.Lock()
	if alone {
		g.waiting++
	}
	for {
		if alone && !g.alone && g.shared == 0 {
			g.waiting--
			g.alone = true
			g.mu.Unlock()
			return nil
		}
		if !alone && !g.alone && g.waiting == 0 {
			g.shared++
			g.mu.Unlock()
			return nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			g.mu.Lock()
			if alone {
				g.waiting--
				g.wake() // shared callers held back for this one may go on
			}
			g.mu.Unlock()
			return ctx.Err()
		case <-ch:
		}
		g.mu.Lock()
	}
}

// leave ends what the matching enter began.
func (g *gate) leave(alone bool) {
	g.mu.Lock()
	if alone {
		g.alone = false
	} else {
		g.shared--
	}
	g.wake()
	g.mu.Unlock()
}

// wake lets every waiting caller look at the gate again. g.mu is held.
func (g *gate) wake() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}
