package idemhttp_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/problem"
)

// TestSQLiteWaitBoundsConnectionWait: on SQLite a transaction holds the
// database's only connection; a duplicate (ModeTx, its driver.TxClaimer)
// or a lease-mode claim waits for it at most Config.Wait (NoWait: at once)
// and answers 409 request-in-progress, instead of waiting for the holder's
// whole handler.
func TestSQLiteWaitBoundsConnectionWait(t *testing.T) {
	t.Parallel()
	drv := testdbSQLite(t)
	e := sqliteEnvOn(t, drv)
	inside, release := make(chan struct{}), make(chan struct{})
	holder := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inside)
		// Held until every duplicate was answered: one that waited for
		// the holder's handler would wait a minute.
		select {
		case <-release:
		case <-time.After(time.Minute):
		}
		w.WriteHeader(201)
	}))
	done := make(chan int, 1)
	go func() { done <- send(holder, "POST", "/hold", "h", `{}`).Code }()
	<-inside
	defer func() {
		close(release)
		if code := <-done; code != 201 {
			t.Errorf("holder: %d", code)
		}
	}()
	var calls atomic.Int64
	for _, c := range []struct {
		name string
		cfg  idemhttp.Config
	}{
		{"tx wait", idemhttp.Config{Wait: 200 * time.Millisecond}},
		{"tx nowait", idemhttp.Config{Wait: idemhttp.NoWait}},
		{"lease wait", idemhttp.Config{Mode: idemhttp.ModeLease, Wait: 200 * time.Millisecond}},
		{"lease nowait", idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait}},
	} {
		h := e.wrap(t, &c.cfg, effectHandler(t, e, 201, &calls))
		start := time.Now()
		rr := send(h, "POST", "/dup", "k-"+strings.ReplaceAll(c.name, " ", "-"), `{}`)
		// Generous for a loaded machine that stalls the process for
		// seconds; far below the holder's minute.
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("%s: answered after %s; Wait is %s", c.name, took.Round(time.Millisecond), c.cfg.Wait)
		}
		checkProblem(t, rr, http.StatusConflict, problem.TypeRequestInProgress)
	}
	if calls.Load() != 0 {
		t.Fatalf("calls = %d, want 0", calls.Load())
	}
}
