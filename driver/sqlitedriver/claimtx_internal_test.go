package sqlitedriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
)

// TestBeginClaimKeepsLateBegin: the connection is freed just as a claim's
// wait runs out, and its Begin finishes before the claim looks. On a loaded
// machine this happens when the first of many concurrent duplicates is
// slow to run: it must still get the key, not answer "in progress" with
// nobody executing it.
func TestBeginClaimKeepsLateBegin(t *testing.T) {
	d := openMigrated(t)
	ctx := t.Context()
	holder, err := d.Begin(ctx) // holds the only connection
	if err != nil {
		t.Fatal(err)
	}
	testHookWaitRanOut = func(begun func() bool) {
		_ = holder.Rollback()
		deadline := time.Now().Add(time.Minute)
		for !begun() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	t.Cleanup(func() { testHookWaitRanOut = nil })
	tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: "k", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Locked {
		t.Fatal("not locked: the Begin that finished after the wait ran out was thrown away")
	}
	// The transaction is alive: it writes and commits.
	if err := d.CommitComplete(ctx, tx, &driver.TxCompleteParams{Scope: "s", Key: "k", Fingerprint: []byte("f"),
		Status: 201, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimWaitsForSlowBeginOnFreeConnection: nobody holds the connection,
// but the process runs the claim's Begin, or finishes it, only after the
// wait ran out (a loaded machine stalls it; NoWait's wait is 25ms). The
// claim must get the key, not answer "in progress" (ErrLockTimeout) for a
// key nobody holds: the wait bounds how long another transaction holds the
// connection, not how fast this process runs.
func TestClaimWaitsForSlowBeginOnFreeConnection(t *testing.T) {
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	now := time.Now()
	var ranOut atomic.Int32
	// The process stalls until the wait ran out, and 50ms more: when the
	// claim looks, its Begin has not finished. (A wait of 200ms: the
	// Begin is over long before the claim looks again.)
	stall := func() {
		for ranOut.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	testHookWaitRanOut = func(func() bool) { ranOut.Add(1) }
	t.Cleanup(func() { testHookBeginStart, testHookBegan, testHookWaitRanOut = nil, nil, nil })
	for _, c := range []struct {
		name  string
		claim func(key string) error
	}{
		{"RecordClaim", func(key string) error {
			res, err := d.Executor().RecordClaim(ctx, &driver.RecordClaimParams{Scope: "s", Key: key,
				Fingerprint: []byte("f"), LeaseToken: "t", LeaseExpiresAt: now.Add(time.Minute),
				Now: now, ExpiresAt: now.Add(time.Hour), LockTimeout: 200 * time.Millisecond})
			if err == nil && !res.Claimed {
				err = errors.New("not claimed")
			}
			return err
		}},
		{"BeginClaim", func(key string) error {
			tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Now: now, Wait: 200 * time.Millisecond})
			if err != nil {
				return err
			}
			if !res.Locked {
				return errors.New("not locked")
			}
			return d.Rollback(ctx, tx)
		}},
	} {
		for _, when := range []string{"before the Begin", "after the BEGIN"} {
			testHookBeginStart, testHookBegan = stall, nil
			if when == "after the BEGIN" {
				testHookBeginStart, testHookBegan = nil, stall
			}
			ranOut.Store(0)
			if err := c.claim("k-" + c.name + when); err != nil {
				t.Errorf("%s of a new key on a free connection, the process stalled %s: %v", c.name, when, err)
			}
			if ranOut.Load() == 0 {
				t.Errorf("%s, stalled %s: the wait did not run out: the test proves nothing", c.name, when)
			}
		}
	}
}

// watchedCtx is a long-lived cancellable context (a worker's root context)
// that counts what is attached to it: context.WithCancel and
// context.AfterFunc register on a parent with an AfterFunc method through
// that method, and stop the registration when the child is cancelled.
type watchedCtx struct {
	context.Context // Background: values only
	done            chan struct{}
	once            sync.Once
	mu              sync.Mutex
	next            int
	attached        map[int]func()
}

func newWatchedCtx() *watchedCtx {
	return &watchedCtx{Context: context.Background(), done: make(chan struct{}), attached: map[int]func(){}}
}

func (c *watchedCtx) Done() <-chan struct{} { return c.done }

func (c *watchedCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

func (c *watchedCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.next
	c.next++
	c.attached[id] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.attached[id]
		delete(c.attached, id)
		return ok
	}
}

// cancel ends the context, running what is attached.
func (c *watchedCtx) cancel() { c.once.Do(c.end) }

func (c *watchedCtx) end() {
	c.mu.Lock()
	fs := c.attached
	c.attached = map[int]func(){}
	c.mu.Unlock()
	close(c.done)
	for _, f := range fs {
		f()
	}
}

func (c *watchedCtx) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.attached)
}

// TestClaimReleasesItsContext: a worker claiming keys on its long-lived
// root context, with BeginClaim or with RecordClaim's LockTimeout, must not
// leave anything attached to that context once each transaction has ended
// through the driver, whichever way it ended: memory would grow with every
// call until the worker stops. The transaction must still end with the
// context while it is open.
func TestClaimReleasesItsContext(t *testing.T) {
	d := openMigrated(t)
	t.Cleanup(func() { _ = d.Close() })
	ctx := newWatchedCtx()
	t.Cleanup(ctx.cancel)
	now := time.Now()
	complete := func(key string) *driver.TxCompleteParams {
		return &driver.TxCompleteParams{Scope: "s", Key: key, Fingerprint: []byte("f"), Status: 201,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	}
	claim := func(key string) *sql.Tx {
		t.Helper()
		tx, res, err := d.BeginClaim(ctx, &driver.TxClaimParams{Scope: "s", Key: key, Wait: 5 * time.Second})
		if err != nil || !res.Locked {
			t.Fatalf("BeginClaim(%s) = %+v, %v", key, res, err)
		}
		return tx
	}
	ends := []struct {
		name string
		end  func(key string)
	}{
		{"CommitComplete", func(key string) {
			if err := d.CommitComplete(ctx, claim(key), complete(key)); err != nil {
				t.Fatal(err)
			}
		}},
		{"CommitComplete of a replay", func(key string) {
			// The key is stored: CommitComplete fails (ErrLeaseLost).
			tx := claim(key)
			if err := d.CommitComplete(ctx, tx, complete(key)); err != nil {
				t.Fatal(err)
			}
			if err := d.CommitComplete(ctx, claim(key), complete(key)); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("CommitComplete of a stored key: %v; want ErrLeaseLost", err)
			}
		}},
		{"CommitComplete after the code's Commit", func(key string) {
			tx := claim(key)
			_ = tx.Commit()
			if err := d.CommitComplete(ctx, tx, complete(key)); !errors.Is(err, driver.ErrTxDone) {
				t.Fatalf("CommitComplete: %v; want ErrTxDone", err)
			}
		}},
		{"Rollback", func(key string) {
			if err := d.Rollback(ctx, claim(key)); err != nil {
				t.Fatal(err)
			}
		}},
		{"RollbackEnded", func(key string) {
			if err := d.RollbackEnded(ctx, claim(key)); err != nil {
				t.Fatal(err)
			}
		}},
		{"Commit", func(key string) {
			if err := d.Commit(ctx, claim(key)); !errors.Is(err, driver.ErrTxAborted) {
				t.Fatalf("Commit: %v; want ErrTxAborted", err)
			}
		}},
		{"RecordClaim with LockTimeout", func(key string) {
			res, err := d.Executor().RecordClaim(ctx, &driver.RecordClaimParams{Scope: "s", Key: key,
				Fingerprint: []byte("f"), LeaseToken: "t", LeaseExpiresAt: now.Add(time.Minute),
				Now: now, ExpiresAt: now.Add(time.Hour), LockTimeout: 5 * time.Second})
			if err != nil || !res.Claimed {
				t.Fatalf("RecordClaim = %+v, %v", res, err)
			}
		}},
	}
	for _, e := range ends {
		for i := range 20 {
			e.end(fmt.Sprintf("%s-%d", e.name, i))
		}
		if n := ctx.count(); n != 0 {
			t.Errorf("after 20 more transactions ended with %s, %d registrations stay attached to the caller's context in all; want none", e.name, n)
		}
	}

	// An open transaction still ends with the context.
	tx := claim("open")
	ctx.cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tx.ExecContext(context.Background(), `SELECT 1`)
		if errors.Is(err, sql.ErrTxDone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the transaction is still open after its context ended: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}
