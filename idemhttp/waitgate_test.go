package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/observe/observetest"
)

// Duplicates of one in-flight request wait for its key's lock one at a
// time per middleware: each waiting in PostgreSQL would hold a connection
// of the pool doing nothing for up to Wait, and a client (or an attacker)
// sending a few copies of one slow request would leave no connection to
// the requests of every other principal.
//
// Pool of 4 connections; principal A's request holds its key until B is
// answered (at most 30 s) and 6 copies of it follow; principal B then
// sends a request of its own (another key, a fast handler), which must
// not wait for A's.
func TestDuplicatesDoNotTakeThePool(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Schema(t, 4)
	drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := pgEnvOn(t, drv)
	// A's request holds its key until B is answered: a B that waited for
	// A's would wait the whole hold. (The copies wait longer than that.)
	const hold = 30 * time.Second
	var calls atomic.Int64
	started, bAnswered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := e.wrap(t, &idemhttp.Config{Wait: 2 * hold, Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Principal"), nil }},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := e.effect(r, r.URL.Query().Get("label")); err != nil {
				t.Error(err)
			}
			if r.Header.Get("X-Principal") == "A" {
				once.Do(func() { close(started) })
				select {
				case <-bAnswered:
				case <-time.After(hold):
				}
			}
			w.WriteHeader(http.StatusCreated)
		}))
	req := func(principal, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay?label="+key, strings.NewReader(`{}`))
		r.Header.Set(idemhttp.KeyHeader, key)
		r.Header.Set("X-Principal", principal)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var wg sync.WaitGroup
	codes := make([]int, 7)
	wg.Go(func() { codes[0] = req("A", "slow").Code })
	<-started
	for i := 1; i < len(codes); i++ {
		wg.Go(func() { codes[i] = req("A", "slow").Code })
	}
	time.Sleep(200 * time.Millisecond) // the copies are waiting
	start := time.Now()
	if w := req("B", "fast"); w.Code != http.StatusCreated {
		t.Errorf("B: %d %s", w.Code, w.Body)
	}
	took := time.Since(start)
	close(bAnswered)
	wg.Wait()
	t.Logf("B answered in %s while A's request held its key with %d copies waiting", took, len(codes)-1)
	if took > hold/2 { // generous for a loaded machine
		t.Errorf("principal B's request took %s: it waited for a connection that principal A's waiting duplicates held (pool of 4)", took)
	}
	for i, c := range codes {
		if c != http.StatusCreated {
			t.Errorf("A's request %d: %d, want 201 (executed or replayed)", i, c)
		}
	}
	if n := e.effects(t, "slow"); n != 1 {
		t.Errorf("A's command applied %d times, want 1", n)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("handler ran %d times, want 2 (A once, B once)", got)
	}
}

// panicOnWaitingClaim is a Tracer whose Start of the claim span panics
// for the second claim of a request whose context has boomKey: the claim
// it makes while waiting for the key's lock, its turn held.
type panicOnWaitingClaim struct{ observetest.Recorder }

type boomKey struct{}

func (t *panicOnWaitingClaim) Start(ctx context.Context, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	if n, ok := ctx.Value(boomKey{}).(*atomic.Int64); ok && name == "idem.http.claim" && n.Add(1) == 2 {
		panic("tracer bug")
	}
	return t.Recorder.Start(ctx, name, attrs...)
}

// A hook that panics while its request holds the key's turn to wait
// gives the turn back: the next duplicate still waits for the first
// request and replays it.
func TestWaitTurnGivenBackOnPanic(t *testing.T) {
	t.Parallel()
	e := pgEnv(t)
	started := make(chan struct{})
	var once sync.Once
	h := e.wrap(t, &idemhttp.Config{Wait: 3 * time.Second, Tracer: &panicOnWaitingClaim{}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(started) })
			time.Sleep(time.Second)
			w.WriteHeader(http.StatusCreated)
		}))
	send := func(ctx context.Context) (code int, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		r := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{}`))
		r.Header.Set(idemhttp.KeyHeader, "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, false
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if code, _ := send(t.Context()); code != http.StatusCreated {
			t.Errorf("first request: %d", code)
		}
	})
	<-started
	if _, panicked := send(context.WithValue(t.Context(), boomKey{}, new(atomic.Int64))); !panicked {
		t.Fatal("the tracer did not panic in the waiting claim")
	}
	start := time.Now()
	if code, _ := send(t.Context()); code != http.StatusCreated {
		t.Errorf("duplicate after a panicking one: %d after %s, want the first's 201 replayed", code, time.Since(start))
	}
	wg.Wait()
}
