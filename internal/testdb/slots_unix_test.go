//go:build unix

package testdb

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSlotsBoundConnections: with every slot taken, a connection waits
// (here until its context ends), and gets the first slot given back.
func TestSlotsBoundConnections(t *testing.T) {
	orig := slotDir
	slotDir = t.TempDir()
	t.Cleanup(func() { slotDir = orig })
	var releases []func()
	for range maxConns {
		release, err := acquireSlot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := acquireSlot(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slot %d: %v; want to wait until the context ends", maxConns+1, err)
	}
	got := make(chan error, 1)
	go func() {
		release, err := acquireSlot(t.Context())
		if err == nil {
			release()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("slot %d taken while all were held: %v", maxConns+1, err)
	default:
	}
	releases[0]()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	for _, r := range releases[1:] {
		r()
	}
}
