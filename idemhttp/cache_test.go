package idemhttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// cacheCountingDriver counts what a middleware asks of its store: transactions,
// executors and record statements. A request answered from the replay
// cache must leave the count unchanged.
type cacheCountingDriver[TTx any] struct {
	driver.Driver[TTx]
	n *atomic.Int64
}

func (d cacheCountingDriver[TTx]) Records() driver.RecordExecutor {
	d.n.Add(1)
	return cacheCountingExecutor{d.Driver.Records(), d.n}
}

func (d cacheCountingDriver[TTx]) Begin(ctx context.Context) (TTx, error) {
	d.n.Add(1)
	return d.Driver.Begin(ctx)
}

func (d cacheCountingDriver[TTx]) RecordsTx(tx TTx) driver.RecordExecutor {
	d.n.Add(1)
	return cacheCountingExecutor{d.Driver.RecordsTx(tx), d.n}
}

// cacheCountingClaimer is cacheCountingDriver over a driver.TxClaimer.
type cacheCountingClaimer[TTx any] struct {
	cacheCountingDriver[TTx]
	tc driver.TxClaimer[TTx]
}

func (d cacheCountingClaimer[TTx]) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (TTx, *driver.TxClaimResult, error) {
	d.n.Add(1)
	return d.tc.BeginClaim(ctx, p)
}

func (d cacheCountingClaimer[TTx]) CommitComplete(ctx context.Context, tx TTx, p *driver.TxCompleteParams) error {
	d.n.Add(1)
	return d.tc.CommitComplete(ctx, tx, p)
}

type cacheCountingExecutor struct {
	driver.RecordExecutor
	n *atomic.Int64
}

func (e cacheCountingExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	e.n.Add(1)
	return e.RecordExecutor.RecordClaim(ctx, p)
}

func (e cacheCountingExecutor) RecordGet(ctx context.Context, p *driver.RecordGetParams) (*driver.Record, error) {
	e.n.Add(1)
	return e.RecordExecutor.RecordGet(ctx, p)
}

func (e cacheCountingExecutor) RecordComplete(ctx context.Context, p *driver.RecordCompleteParams) error {
	e.n.Add(1)
	return e.RecordExecutor.RecordComplete(ctx, p)
}

func (e cacheCountingExecutor) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	e.n.Add(1)
	return e.RecordExecutor.RecordRelease(ctx, p)
}

func (e cacheCountingExecutor) RecordExtendLease(ctx context.Context, p *driver.RecordExtendLeaseParams) error {
	e.n.Add(1)
	return e.RecordExecutor.RecordExtendLease(ctx, p)
}

// countedDriver wraps drv to count its use in n; generic hides its TxClaimer so
// that ModeTx takes the Begin/RecordClaim/RecordComplete/Commit path.
func countedDriver[TTx any](drv driver.Driver[TTx], n *atomic.Int64, generic bool) driver.Driver[TTx] {
	c := cacheCountingDriver[TTx]{drv, n}
	if tc, ok := drv.(driver.TxClaimer[TTx]); ok && !generic {
		return cacheCountingClaimer[TTx]{c, tc}
	}
	return c
}

// cacheInstance is one server process: a middleware on its own pool or
// *sql.DB, with the count of its store calls.
type cacheInstance struct {
	h     http.Handler
	mw    interface{ CacheStats() idemhttp.CacheStats }
	store *atomic.Int64
}

func newCacheInstance[TTx any](t *testing.T, drv driver.Driver[TTx], generic bool, cfg *idemhttp.Config, h http.Handler) *cacheInstance {
	t.Helper()
	in := &cacheInstance{store: new(atomic.Int64)}
	mw, err := idemhttp.New(countedDriver(drv, in.store, generic), cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.h, in.mw = mw.Handler(h), mw
	return in
}

// cacheBackend opens n instances on one fresh database, as n processes
// would have (each with its own pool), plus a way to run SQL on it.
type cacheBackend struct {
	name string
	open func(t *testing.T, cfg *idemhttp.Config, h http.Handler, n int) ([]*cacheInstance, func(t *testing.T, sql string))
}

var cacheBackends = func() []cacheBackend {
	pg := func(generic bool) func(*testing.T, *idemhttp.Config, http.Handler, int) ([]*cacheInstance, func(*testing.T, string)) {
		return func(t *testing.T, cfg *idemhttp.Config, h http.Handler, n int) ([]*cacheInstance, func(*testing.T, string)) {
			first := testdb.Postgres(t)
			schema := schemaOf(t, first)
			ins := []*cacheInstance{newCacheInstance[pgx.Tx](t, first, generic, cfg, h)}
			for range n - 1 {
				drv, err := pgdriver.New(testdb.Pool(t, schema, 10), &pgdriver.Config{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				ins = append(ins, newCacheInstance[pgx.Tx](t, drv, generic, cfg, h))
			}
			return ins, func(t *testing.T, q string) {
				if _, err := first.Pool().Exec(t.Context(), q); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	lite := func(generic bool) func(*testing.T, *idemhttp.Config, http.Handler, int) ([]*cacheInstance, func(*testing.T, string)) {
		return func(t *testing.T, cfg *idemhttp.Config, h http.Handler, n int) ([]*cacheInstance, func(*testing.T, string)) {
			path := testdb.SQLitePath(t)
			var ins []*cacheInstance
			var first *sqlitedriver.Driver
			for i := range n {
				drv, err := sqlitedriver.Open(path, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = drv.Close() })
				if i == 0 {
					if err := drv.Migrate(t.Context()); err != nil {
						t.Fatal(err)
					}
					first = drv
				}
				ins = append(ins, newCacheInstance[*sql.Tx](t, drv, generic, cfg, h))
			}
			return ins, func(t *testing.T, q string) {
				if _, err := first.DB().ExecContext(t.Context(), q); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return []cacheBackend{
		{"postgres", pg(false)}, {"postgres-generic", pg(true)},
		{"sqlite", lite(false)}, {"sqlite-generic", lite(true)},
	}
}()

// forEachCache runs fn per mode and backend, in parallel.
func forEachCache(t *testing.T, fn func(t *testing.T, mode idemhttp.Mode, b cacheBackend)) {
	t.Helper()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		for _, b := range cacheBackends {
			t.Run(mode.String()+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				fn(t, mode, b)
			})
		}
	}
}

// cacheHandler counts its executions and answers 201 with headers that are
// replayed (Content-Type, Location, Cache-Control, a listed X-Trace) and one
// that is not, and a body naming the execution.
func cacheHandler(calls *atomic.Int64, pad int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/things/"+r.URL.Query().Get("id"))
		w.Header().Set("Cache-Control", "private")
		w.Header().Add("X-Trace", "a")
		w.Header().Add("X-Trace", "b")
		w.Header().Set("X-Not-Replayed", "1")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"execution":%d,"pad":%q}`, n, strings.Repeat("p", pad))
	})
}

func cacheConfig(cfg idemhttp.Config) *idemhttp.Config {
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ReplayHeaders = []string{"X-Trace"}
	return &cfg
}

// checkSameCachedReplay asserts that got is a replay byte for byte and
// header for header identical to want, another replay. Content-Length is
// framing (net/http sets it on the wire for a small body): some paths set it
// and some do not, but when set it is the body's.
func checkSameCachedReplay(t *testing.T, what string, got, want *httptest.ResponseRecorder) {
	t.Helper()
	if got.Code != want.Code || got.Body.String() != want.Body.String() {
		t.Fatalf("%s: %d %q, want %d %q", what, got.Code, got.Body, want.Code, want.Body)
	}
	content := func(rr *httptest.ResponseRecorder) http.Header {
		h := rr.Header().Clone()
		if n := h.Values("Content-Length"); len(n) > 0 && (len(n) != 1 || n[0] != strconv.Itoa(rr.Body.Len())) {
			t.Fatalf("%s: Content-Length %v for a body of %d bytes", what, n, rr.Body.Len())
		}
		h.Del("Content-Length")
		return h
	}
	if g, w := content(got), content(want); !maps.EqualFunc(g, w, func(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }) {
		t.Fatalf("%s: headers %v, want %v", what, g, w)
	}
	if got.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("%s: not marked as a replay", what)
	}
}

// noStoreCalls asserts that fn makes no store call on in.
func noStoreCalls(t *testing.T, in *cacheInstance, what string, fn func()) {
	t.Helper()
	before := in.store.Load()
	fn()
	if n := in.store.Load() - before; n != 0 {
		t.Fatalf("%s: %d store calls, want 0", what, n)
	}
}

// TestCacheTwoInstances: two processes on one database. The executing
// instance answers every retry from memory; the other reads the record once
// from the store (a miss) and then answers from memory too. Both replays are
// identical, byte for byte and header for header, to a replay from the
// store.
func TestCacheTwoInstances(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		var calls atomic.Int64
		var outcomes sync.Map
		cfg := cacheConfig(idemhttp.Config{Mode: mode, OnOutcome: func(r *http.Request, o idemhttp.Outcome) {
			outcomes.Store(r.Header.Get("X-Request"), o)
		}})
		ins, _ := b.open(t, cfg, cacheHandler(&calls, 100), 2)
		a, other := ins[0], ins[1]
		first := send(a.h, "POST", "/pay?id=1", "k", `{"amount":"1.00","to":"bob"}`)
		if first.Code != 201 || first.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("first: %d %v", first.Code, first.Header())
		}
		if st := a.mw.CacheStats(); st.Entries != 1 {
			t.Fatalf("executing instance: %+v, want the committed record cached", st)
		}
		// The other instance: a miss, the record from the store, cached.
		fromStore := send(other.h, "POST", "/pay?id=1", "k", `{"to":"bob","amount":"1.00"}`, "X-Request", "other-1")
		if st := other.mw.CacheStats(); st.Misses != 1 || st.Hits != 0 || st.Entries != 1 {
			t.Fatalf("other instance after its first replay: %+v, want 1 miss and 1 entry", st)
		}
		if fromStore.Code != 201 || fromStore.Body.String() != first.Body.String() || fromStore.Header().Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("replay from the store: %d %q %v", fromStore.Code, fromStore.Body, fromStore.Header())
		}
		if fromStore.Header().Get("X-Not-Replayed") != "" || strings.Join(fromStore.Header().Values("X-Trace"), ",") != "a,b" {
			t.Fatalf("replayed headers: %v", fromStore.Header())
		}
		for i, in := range []*cacheInstance{a, other, a, other} {
			id := fmt.Sprintf("hit-%d", i)
			var rr *httptest.ResponseRecorder
			noStoreCalls(t, in, id, func() {
				rr = send(in.h, "POST", "/pay?id=1", "k", "{ \"amount\": \"1.00\", \"to\": \"bob\" }", "X-Request", id)
			})
			checkSameCachedReplay(t, id, rr, fromStore)
			if o, _ := outcomes.Load(id); o != idemhttp.OutcomeReplayed {
				t.Fatalf("%s: outcome %v, want replayed", id, o)
			}
		}
		if o, _ := outcomes.Load("other-1"); o != idemhttp.OutcomeReplayed {
			t.Fatalf("store replay: outcome %v", o)
		}
		if sa, so := a.mw.CacheStats(), other.mw.CacheStats(); sa.Hits != 2 || sa.Misses != 1 || so.Hits != 2 || so.Misses != 1 {
			t.Fatalf("stats: executing %+v, other %+v", sa, so)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// TestCacheZeroRoundTrips: a replay from the cache asks nothing of the
// store, while a replay without the cache does.
func TestCacheZeroRoundTrips(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		var calls atomic.Int64
		ins, _ := b.open(t, cacheConfig(idemhttp.Config{Mode: mode}), cacheHandler(&calls, 10), 1)
		in := ins[0]
		before := in.store.Load()
		send(in.h, "POST", "/pay", "k", `{}`)
		if in.store.Load() == before {
			t.Fatal("the counting driver countedDriver nothing for an execution")
		}
		for i := range 10 {
			noStoreCalls(t, in, fmt.Sprintf("replay %d", i), func() {
				if rr := send(in.h, "POST", "/pay", "k", `{}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
					t.Fatalf("replay: %d %v", rr.Code, rr.Header())
				}
			})
		}
		if st := in.mw.CacheStats(); st.Hits != 10 {
			t.Fatalf("stats = %+v", st)
		}
		// The same without the cache: every replay reads the store.
		off, _ := b.open(t, cacheConfig(idemhttp.Config{Mode: mode, ReplayCacheBytes: idemhttp.NoReplayCache}), cacheHandler(&calls, 10), 1)
		send(off[0].h, "POST", "/pay", "k", `{}`)
		before = off[0].store.Load()
		if rr := send(off[0].h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" || off[0].store.Load() == before {
			t.Fatalf("uncached replay: %d, %d store calls", rr.Code, off[0].store.Load()-before)
		}
	})
}

// TestCacheExpiry: an entry is never served at or past the record's
// expiry; the request goes to the store, where the record has expired too,
// and executes again. Entries filled at commit (executing instance) and
// from a store read (other instance) both expire.
func TestCacheExpiry(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		var calls atomic.Int64
		var now atomic.Int64
		now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
		clock := func() time.Time { return time.Unix(0, now.Load()) }
		ins, _ := b.open(t, cacheConfig(idemhttp.Config{Mode: mode, Now: clock}), cacheHandler(&calls, 10), 2)
		a, other := ins[0], ins[1]
		send(a.h, "POST", "/pay", "k", `{}`)
		now.Add(int64(time.Hour))
		send(other.h, "POST", "/pay", "k", `{}`) // the other instance caches it
		now.Add(int64(23*time.Hour - time.Second))
		for _, in := range []*cacheInstance{a, other} {
			noStoreCalls(t, in, "just before expiry", func() {
				if rr := send(in.h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
					t.Fatalf("not replayed before the TTL: %d", rr.Code)
				}
			})
		}
		now.Add(int64(time.Second)) // exactly the record's expiry
		rr := send(a.h, "POST", "/pay", "k", `{}`)
		if rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" || !strings.Contains(rr.Body.String(), `"execution":2`) {
			t.Fatalf("executing instance at expiry: %d %v %s, want a second execution", rr.Code, rr.Header(), rr.Body)
		}
		// The other instance's entry is the old record's: dropped, and the
		// store now has the new record, which it replays.
		rr = send(other.h, "POST", "/pay", "k", `{}`)
		if rr.Header().Get(idemhttp.ReplayedHeader) != "true" || !strings.Contains(rr.Body.String(), `"execution":2`) {
			t.Fatalf("other instance after expiry: %d %s, want the second execution replayed", rr.Code, rr.Body)
		}
		if n := calls.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
		// Past the expiry, even another body is a new execution.
		now.Add(int64(25 * time.Hour))
		if rr := send(other.h, "POST", "/pay", "k", `{"other":1}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("after the second expiry: %d %v", rr.Code, rr.Header())
		}
		if n := calls.Load(); n != 3 {
			t.Fatalf("handler ran %d times, want 3", n)
		}
	})
}

// TestCacheMismatch: another request with a cached key gets the configured
// mismatch answer from memory; nothing executes.
func TestCacheMismatch(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		for _, status := range []int{409, 422} {
			var calls atomic.Int64
			var mismatches atomic.Int64
			cfg := cacheConfig(idemhttp.Config{Mode: mode, MismatchStatus: status, OnOutcome: func(_ *http.Request, o idemhttp.Outcome) {
				if o == idemhttp.OutcomeMismatch {
					mismatches.Add(1)
				}
			}})
			ins, _ := b.open(t, cfg, cacheHandler(&calls, 10), 2)
			a, other := ins[0], ins[1]
			send(a.h, "POST", "/pay", "k", `{"amount":"1.00"}`)
			// From the store (not cached yet on the other instance): the
			// answer the cache must reproduce; the record gets cached.
			want := send(other.h, "POST", "/pay", "k", `{"amount":"2.00"}`)
			checkProblem(t, want, status, problem.TypeKeyReused)
			want = send(other.h, "POST", "/pay", "k", `{"amount":"2.00"}`)
			for _, in := range []*cacheInstance{a, other} {
				for _, req := range [][2]string{{"/pay", `{"amount":"2.00"}`}, {"/pay?x=1", `{"amount":"1.00"}`}} {
					var rr *httptest.ResponseRecorder
					noStoreCalls(t, in, "mismatch", func() { rr = send(in.h, "POST", req[0], "k", req[1]) })
					if rr.Code != want.Code || rr.Body.String() != want.Body.String() || !maps.EqualFunc(rr.Header(), want.Header(), func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }) {
						t.Fatalf("cached mismatch: %d %v %s, want %d %v %s", rr.Code, rr.Header(), rr.Body, want.Code, want.Header(), want.Body)
					}
					checkProblem(t, rr, status, problem.TypeKeyReused)
				}
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
			if n := mismatches.Load(); n != 6 {
				t.Fatalf("%d mismatch outcomes, want 6", n)
			}
			if sa, so := a.mw.CacheStats(), other.mw.CacheStats(); sa.Hits != 2 || so.Hits != 3 {
				t.Fatalf("stats: %+v, %+v", sa, so)
			}
		}
	})
}

// TestCacheBoundUnderFlood: 6,000 distinct keys (ModeTx on PostgreSQL;
// 4,000 or, on SQLite, 1,500 elsewhere) with 1 KiB responses through a middleware with a 1 MiB
// cache: the accounted bytes never exceed the budget (watched while the
// flood runs), and retries of recent keys are still answered from memory.
func TestCacheBoundUnderFlood(t *testing.T) {
	t.Parallel()
	const budget = 1 << 20
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		for _, b := range cacheBackends {
			if strings.HasSuffix(b.name, "-generic") {
				continue // the ModeTx path makes no difference to the bound
			}
			t.Run(mode.String()+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				var calls atomic.Int64
				ins, _ := b.open(t, cacheConfig(idemhttp.Config{Mode: mode, ReplayCacheBytes: budget}), cacheHandler(&calls, 1024), 1)
				in := ins[0]
				// The full flood on the fastest path; elsewhere a smaller
				// one, still over the budget (SQLite syncs every write).
				keys, workers := int64(4000), 8
				switch {
				case mode == idemhttp.ModeTx && b.name == "postgres":
					keys = 6000
				case strings.HasPrefix(b.name, "sqlite"):
					keys, workers = 1500, 2 // one writer at a time anyway
				}
				stop := make(chan struct{})
				var maxSeen atomic.Int64
				var watch sync.WaitGroup
				watch.Go(func() {
					for {
						if st := in.mw.CacheStats(); st.Bytes > maxSeen.Load() {
							maxSeen.Store(st.Bytes)
						}
						select {
						case <-stop:
							return
						case <-time.After(time.Millisecond):
						}
					}
				})
				var next atomic.Int64
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						for i := next.Add(1) - 1; i < keys; i = next.Add(1) - 1 {
							key := fmt.Sprintf("flood-%05d", i)
							if rr := send(in.h, "POST", "/pay", key, `{}`); rr.Code != 201 {
								t.Errorf("%s: %d %s", key, rr.Code, rr.Body)
								return
							}
						}
					})
				}
				wg.Wait()
				close(stop)
				watch.Wait()
				st := in.mw.CacheStats()
				if st.Bytes > budget || maxSeen.Load() > budget || st.MaxBytes != budget {
					t.Fatalf("cache over its budget: %+v, max seen %d", st, maxSeen.Load())
				}
				if st.Evictions == 0 || st.Bytes < budget/2 {
					t.Fatalf("stats = %+v: want a full cache with evictions", st)
				}
				noStoreCalls(t, in, "recent key", func() {
					if rr := send(in.h, "POST", "/pay", fmt.Sprintf("flood-%05d", keys-1), `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
						t.Fatalf("recent key not replayed: %d", rr.Code)
					}
				})
				// An evicted key still replays, from the store.
				if rr := send(in.h, "POST", "/pay", "flood-00000", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
					t.Fatalf("evicted key: %d", rr.Code)
				}
				if n := calls.Load(); n != keys {
					t.Fatalf("handler ran %d times, want %d", n, keys)
				}
				t.Logf("%+v, max seen %d", st, maxSeen.Load())
			})
		}
	}
}

// TestCacheDisabled: with NoReplayCache every replay and mismatch is
// answered from the store, as before the cache, and a record deleted by hand
// lets the key execute again at once. With the cache, the instance that
// cached the record keeps replaying it (the documented difference).
func TestCacheDisabled(t *testing.T) {
	t.Parallel()
	forEachCache(t, func(t *testing.T, mode idemhttp.Mode, b cacheBackend) {
		var calls atomic.Int64
		ins, exec := b.open(t, cacheConfig(idemhttp.Config{Mode: mode, ReplayCacheBytes: idemhttp.NoReplayCache}), cacheHandler(&calls, 10), 1)
		in := ins[0]
		first := send(in.h, "POST", "/pay", "k", `{}`)
		for i := range 3 {
			before := in.store.Load()
			rr := send(in.h, "POST", "/pay", "k", `{}`)
			if rr.Code != 201 || rr.Body.String() != first.Body.String() || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("replay %d: %d %s", i, rr.Code, rr.Body)
			}
			if in.store.Load() == before {
				t.Fatalf("replay %d answered without the store", i)
			}
			before = in.store.Load()
			checkProblem(t, send(in.h, "POST", "/pay", "k", `{"x":1}`), 409, problem.TypeKeyReused)
			if in.store.Load() == before {
				t.Fatalf("mismatch %d answered without the store", i)
			}
		}
		if st := in.mw.CacheStats(); st != (idemhttp.CacheStats{}) {
			t.Fatalf("disabled cache has stats %+v", st)
		}
		exec(t, `DELETE FROM idempotency_record`)
		if rr := send(in.h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "" || calls.Load() != 2 {
			t.Fatalf("after a manual delete: %d replayed=%q, %d calls; want a new execution", rr.Code, rr.Header().Get(idemhttp.ReplayedHeader), calls.Load())
		}

		// With the cache: the manual delete is not seen by an instance
		// holding the record, only by one that does not.
		calls.Store(0)
		ins, exec = b.open(t, cacheConfig(idemhttp.Config{Mode: mode}), cacheHandler(&calls, 10), 2)
		send(ins[0].h, "POST", "/pay", "k", `{}`)
		exec(t, `DELETE FROM idempotency_record`)
		if rr := send(ins[0].h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("cached instance after a manual delete: %d, want a replay from memory", rr.Code)
		}
		if rr := send(ins[1].h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "" || calls.Load() != 2 {
			t.Fatalf("uncached instance after a manual delete: %d, %d calls; want a new execution", rr.Code, calls.Load())
		}
	})
}

// BenchmarkCachedReplay measures a replay through the middleware: from the
// replay cache, and (for comparison) from the store without it. SQLite in a
// temporary file; the cached replay never reaches it.
func BenchmarkCachedReplay(b *testing.B) {
	for _, c := range []struct {
		name  string
		bytes int64
	}{{"cache", 0}, {"store", idemhttp.NoReplayCache}} {
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			b.Run(c.name+"/"+mode.String(), func(b *testing.B) {
				drv := testdb.SQLite(b)
				var calls atomic.Int64
				mw, err := idemhttp.New(drv, cacheConfig(idemhttp.Config{Mode: mode, ReplayCacheBytes: c.bytes}))
				if err != nil {
					b.Fatal(err)
				}
				h := mw.Handler(cacheHandler(&calls, 200))
				const reqBody = `{"amount":"10.00","currency":"EUR","to":"bob"}`
				if rr := send(h, "POST", "/pay", "bench-key", reqBody); rr.Code != 201 {
					b.Fatal(rr.Code)
				}
				b.ReportAllocs()
				b.SetParallelism(8) // 16 clients on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					req := httptest.NewRequest("POST", "/pay", nil)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "bench-key")
					for pb.Next() {
						req.Body = cacheBenchBody{strings.NewReader(reqBody)}
						rr := httptest.NewRecorder()
						h.ServeHTTP(rr, req)
						if rr.Code != 201 {
							b.Errorf("replay: %d", rr.Code)
							return
						}
					}
				})
				b.StopTimer()
				if calls.Load() != 1 {
					b.Fatalf("handler ran %d times", calls.Load())
				}
			})
		}
	}
}

type cacheBenchBody struct{ *strings.Reader }

func (cacheBenchBody) Close() error { return nil }
