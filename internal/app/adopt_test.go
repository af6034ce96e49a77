package app

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// A new broker log is marked as its database's only once the outbox was
// republished into it: a republication cut short (a stop, a crash, a
// database error) leaves the log unmarked, so the next start takes it for
// new again and republishes everything, instead of trusting a log that
// holds only part of the outbox.
func TestAdoptMarksOnlyAfterRedrive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := dbIdentity{Where: "sqlite:/x/idemd.db", Instance: "0190-test"}
	fresh, err := checkMarker(dir, id)
	if err != nil || !fresh {
		t.Fatalf("checkMarker on an empty dir: fresh=%v, %v", fresh, err)
	}
	a := &App{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := &embeddedBroker{dir: dir, fresh: true, identity: id}

	cut := errors.New("context canceled halfway")
	if err := b.adopt(context.Background(), a, func(context.Context) (int, error) { return 500, cut }); !errors.Is(err, cut) {
		t.Fatalf("adopt = %v, want the redrive's error", err)
	}
	if _, err := os.Stat(filepath.Join(dir, embeddedMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("marker after an interrupted redrive: %v; want none", err)
	}
	if fresh, err := checkMarker(dir, id); err != nil || !fresh {
		t.Fatalf("next start: fresh=%v, %v; want the log taken for new again", fresh, err)
	}

	calls := 0
	redrive := func(context.Context) (int, error) { calls++; return 1000, nil }
	if err := b.adopt(context.Background(), a, redrive); err != nil {
		t.Fatal(err)
	}
	if fresh, err := checkMarker(dir, id); err != nil || fresh {
		t.Fatalf("after a whole redrive: fresh=%v, %v; want the log marked", fresh, err)
	}
	if err := b.adopt(context.Background(), a, redrive); err != nil || calls != 1 {
		t.Errorf("adopt again: %v, %d redrives; want none (adopted)", err, calls)
	}
}
