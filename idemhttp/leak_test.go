package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// Many requests, each under a key of its own, that end in every awkward
// way (the handler panics, the client goes away while it runs, the handler
// outlives renewals of its lease, or it simply answers): once they are
// answered, the middleware leaves no goroutine behind and holds no
// connection of the pool. Not parallel: it counts the process's goroutines.
func TestManyRequestsLeaveNothingBehind(t *testing.T) {
	for _, backend := range []string{"postgres", "sqlite"} {
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			t.Run(backend+"/"+mode.String(), func(t *testing.T) {
				testManyRequestsLeaveNothingBehind(t, backend, mode)
			})
		}
	}
}

func testManyRequestsLeaveNothingBehind(t *testing.T, backend string, mode idemhttp.Mode) {
	var (
		e     *env
		inUse func() int // connections taken
	)
	if backend == "postgres" {
		_, schema := testdb.Schema(t, 1)
		pool := testdb.Pool(t, schema, 4)
		drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		e = pgEnvOn(t, drv)
		inUse = func() int { return int(pool.Stat().AcquiredConns()) }
	} else {
		drv := testdbSQLite(t)
		e = sqliteEnvOn(t, drv)
		inUse = func() int { return drv.DB().Stats().InUse }
	}
	// A slow handler outlives a renewal or two of a lease; ModeTx has no
	// lease to renew, and on SQLite it runs the requests one at a time:
	// 400 ms there made its 96 requests take 11 s.
	slow := 400 * time.Millisecond
	if mode == idemhttp.ModeTx {
		slow = 100 * time.Millisecond
	}
	var calls atomic.Int64
	normal := effectHandler(t, e, 201, &calls)
	h := e.wrap(t, &idemhttp.Config{Mode: mode, Lease: time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("do") {
		case "panic":
			panic("boom")
		case "slow":
			select {
			case <-time.After(slow):
			case <-r.Context().Done():
			}
		case "gone":
			<-r.Context().Done() // the client went away
			return
		}
		normal.ServeHTTP(w, r)
	}))
	serve := func(i int) {
		do := [...]string{"ok", "panic", "gone", "slow"}[i%4]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, "POST", "/pay?label=l&do="+do, strings.NewReader(`{"amount":"1.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("key-%d-%d", i, time.Now().UnixNano()))
		if do == "gone" {
			time.AfterFunc(50*time.Millisecond, cancel)
		}
		defer func() { _ = recover() }()
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	burst := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { serve(i) })
		}
		wg.Wait()
	}
	burst(8) // warm up the pool
	runtime.GC()
	time.Sleep(500 * time.Millisecond)
	before := runtime.NumGoroutine()
	for range 6 {
		burst(16)
	}
	deadline := time.Now().Add(20 * time.Second)
	for (runtime.NumGoroutine() > before+2 || inUse() > 0) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines 20s after 96 requests, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	if n := inUse(); n > 0 {
		t.Fatalf("%d connections still acquired", n)
	}
	t.Logf("goroutines %d -> %d, connections in use %d", before, runtime.NumGoroutine(), inUse())
}
