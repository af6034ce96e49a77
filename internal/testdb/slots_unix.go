//go:build unix

package testdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// slotDir holds the slot files (a test of this package uses its own).
var slotDir = filepath.Join(os.TempDir(), "idem-testdb-slots")

// acquireSlot takes one of maxConns connection slots shared by every test
// process of the machine (go test runs several packages at once, each with
// parallel tests and pools): a slot is an exclusive flock on one of
// maxConns files. It waits while all are taken, at most slotWait (or until
// ctx ends), so a burst of connections queues instead of failing with
// PostgreSQL's "too many clients already". release gives the slot back.
func acquireSlot(ctx context.Context) (release func(), err error) {
	dir := slotDir
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("testdb: connection slots: %w", err)
	}
	deadline := time.Now().Add(slotWait)
	for {
		for _, i := range rand.Perm(maxConns) {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("slot-%02d", i)), os.O_CREATE|os.O_RDWR, 0o666)
			if err != nil {
				return nil, fmt.Errorf("testdb: connection slots: %w", err)
			}
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				_ = f.Close()
				continue
			}
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("testdb: all %d PostgreSQL connection slots of this machine's tests stayed taken for %s", maxConns, slotWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(2+rand.IntN(8)) * time.Millisecond):
		}
	}
}
