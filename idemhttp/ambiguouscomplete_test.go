package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// commitThenFailDriver's first RecordComplete stores the outcome and then
// reports an error, as when the connection breaks after the UPDATE
// committed and before its answer arrived.
type commitThenFailDriver struct{ faultyDriver }

func (d *commitThenFailDriver) Records() driver.RecordExecutor {
	return commitThenFailExecutor{RecordExecutor: d.Driver.Records(), d: d}
}

type commitThenFailExecutor struct {
	driver.RecordExecutor
	d *commitThenFailDriver
}

func (e commitThenFailExecutor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	err := e.RecordExecutor.RecordComplete(ctx, p)
	if err == nil && e.d.failComplete.Add(-1) >= 0 {
		return errors.New("transient: connection reset after commit")
	}
	return err
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLeaseCompleteCommittedDespiteError: in ModeLease, a store of the
// outcome that committed but reported an error is retried, and the retry
// finds the record already completed. That is this request's own outcome,
// stored: it is reported OutcomeExecuted, not OutcomeNotStored with an
// error log saying another request may have executed the command too
// (which sends on-call looking for a double charge).
func TestLeaseCompleteCommittedDespiteError(t *testing.T) {
	t.Parallel()
	drv := &commitThenFailDriver{faultyDriver{Driver: testdb.SQLite(t)}}
	drv.failComplete.Store(1)
	var logs syncBuffer
	var outcomes []idemhttp.Outcome
	var mu sync.Mutex
	var calls atomic.Int64
	mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait,
		Scope:  func(*http.Request) (string, error) { return "p", nil },
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnOutcome: func(_ *http.Request, o idemhttp.Outcome) {
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charged":true}`))
	}))
	if rr := send(h, "POST", "/charge", "k1", `{}`); rr.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", rr.Code, rr.Body)
	}
	if rr := send(h, "POST", "/charge", "k1", `{}`); rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d replayed=%q", rr.Code, rr.Header().Get(idemhttp.ReplayedHeader))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 2 || outcomes[0] != idemhttp.OutcomeExecuted {
		t.Errorf("outcomes = %v, want [executed replayed]", outcomes)
	}
	if strings.Contains(logs.String(), "another request may have executed") {
		t.Errorf("misleading log of a lost lease:\n%s", logs.String())
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times", calls.Load())
	}
}
