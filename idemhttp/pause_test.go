package idemhttp_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// A ModeLease replica frozen while its handler runs (a long GC pause, a VM
// migration, SIGSTOP: its lease renewals freeze with it) for longer than
// the lease, while a retry of the same key on another replica takes the
// key over and executes: when it wakes up, its handler's context has
// ended (cause driver.ErrLeaseLost), so a handler that checks it before
// its external call does not make it a second time, and what the frozen
// replica answers is never stored over the other replica's response: a
// later retry replays the second replica's.
func TestLeaseOwnerFrozenPastItsLease(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	base := testdb.SQLite(t)
	thaw := make(chan struct{})
	frozen := &renewFaultDriver{Driver: base, extend: func(ctx context.Context, _ *driver.RecordExtendLeaseParams, next func() error) error {
		<-thaw // the renewer is frozen too
		return next()
	}}
	mwA, err := idemhttp.New[*sql.Tx](frozen, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	mwB, err := idemhttp.New[*sql.Tx](base, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	var charges atomic.Int32
	entered := make(chan struct{})
	cause := make(chan error, 1)
	hA := mwA.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-thaw
		if err := r.Context().Err(); err != nil {
			cause <- context.Cause(r.Context())
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		cause <- nil
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"by":"a"}`))
	}))
	hB := mwB.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"by":"b"}`))
	}))

	answeredA := make(chan int, 1)
	go func() { answeredA <- send(hA, "POST", "/charge", "k", `{}`).Code }()
	<-entered
	// The retry on the other replica: 409 while the lease runs, then it
	// takes the key over.
	var codeB int
	for deadline := time.Now().Add(10 * lease); ; time.Sleep(lease / 4) {
		rr := send(hB, "POST", "/charge", "k", `{}`)
		codeB = rr.Code
		if codeB == http.StatusCreated || time.Now().After(deadline) {
			if codeB == http.StatusCreated && rr.Body.String() != `{"by":"b"}` {
				t.Fatalf("replica b answered %s", rr.Body)
			}
			break
		}
		if codeB != http.StatusConflict {
			t.Fatalf("replica b answered %d %s while a holds the key", codeB, rr.Body)
		}
	}
	if codeB != http.StatusCreated {
		t.Fatalf("replica b never took over the key of the frozen replica (last %d)", codeB)
	}
	close(thaw) // replica a wakes up
	if err := <-cause; !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("the frozen replica's handler woke up with its context %v, want ended by driver.ErrLeaseLost", err)
	}
	codeA := <-answeredA
	if n := charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
	rr := send(hA, "POST", "/charge", "k", `{}`)
	if rr.Code != http.StatusCreated || rr.Body.String() != `{"by":"b"}` || rr.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("a later retry: %d %s (replayed %q), want replica b's 201 replayed", rr.Code, rr.Body, rr.Header().Get("Idempotent-Replayed"))
	}
	t.Logf("frozen replica answered %d once awake; replica b 201; a later retry replays b's", codeA)
}
