package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/observe/observetest"
)

// hookTracer is an observetest.Recorder whose Start of the span named
// start, and End of the span named end, panic while boom is set.
type hookTracer struct {
	rec        observetest.Recorder
	start, end string
	boom       *atomic.Bool
}

func (t *hookTracer) Start(ctx context.Context, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	if name == t.start && t.boom.Load() {
		panic("tracer bug: Start " + name)
	}
	ctx, s := t.rec.Start(ctx, name, attrs...)
	if name == t.end {
		return ctx, &hookSpan{Span: s, boom: t.boom}
	}
	return ctx, s
}

type hookSpan struct {
	observe.Span
	boom *atomic.Bool
}

func (s *hookSpan) End() {
	s.Span.End()
	if s.boom.Load() {
		panic("tracer bug: End")
	}
}

// hookCase is a user hook that panics (while boom is set) somewhere
// between the claim of the key and the end of the command.
type hookCase struct {
	name string
	// set installs the hook in cfg; after reports that the handler
	// returned.
	set func(cfg *idemhttp.Config, boom, after *atomic.Bool)
}

var hookCases = []hookCase{
	{"claim-span-end", func(cfg *idemhttp.Config, boom, _ *atomic.Bool) {
		cfg.Tracer = &hookTracer{end: "idem.http.claim", boom: boom}
	}},
	{"execute-span-start", func(cfg *idemhttp.Config, boom, _ *atomic.Bool) {
		cfg.Tracer = &hookTracer{start: "idem.http.execute", boom: boom}
	}},
	{"clock-after-handler", func(cfg *idemhttp.Config, boom, after *atomic.Bool) {
		cfg.Now = func() time.Time {
			if boom.Load() && after.Load() {
				panic("clock bug")
			}
			return time.Now()
		}
	}},
	{"store-policy", func(cfg *idemhttp.Config, boom, _ *atomic.Bool) {
		cfg.Store = func(status int) bool {
			if boom.Load() {
				panic("store policy bug")
			}
			return idemhttp.DefaultStore(status)
		}
	}},
}

// TestHookPanicReleasesKey: a user hook that panics while the key is
// held (Config.Tracer's spans, Config.Now, Config.Store; before or after
// the handler) must undo like a handler that panics: in ModeTx the
// transaction rolled back, in ModeLease the key released, at once; the
// panic goes on. A retry right after executes (or, if the command was
// committed before the hook panicked, replays). A tracer or clock that
// panicked with the ModeTx transaction open used to leak it (the key
// answered 409 forever on PostgreSQL; SQLite's only connection was held);
// in ModeLease a panicking Store left the key in progress until its lease
// expired.
func TestHookPanicReleasesKey(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		for _, hc := range hookCases {
			t.Run(mode.String()+"/"+hc.name, func(t *testing.T) {
				t.Parallel()
				forEach(t, func(t *testing.T, e *env) { testHookPanic(t, e, mode, hc) })
			})
		}
	}
}

func testHookPanic(t *testing.T, e *env, mode idemhttp.Mode, hc hookCase) {
	var calls atomic.Int64
	var boom, after atomic.Bool
	boom.Store(true)
	cfg := &idemhttp.Config{Mode: mode, Wait: 300 * time.Millisecond, Lease: time.Minute}
	hc.set(cfg, &boom, &after)
	h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if err := e.effect(r, "hook"); err != nil {
			t.Error(err)
		}
		w.WriteHeader(201)
		after.Store(true)
	}))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic swallowed: the server must still see it")
			}
		}()
		send(h, "POST", "/pay", "k", `{}`)
	}()
	boom.Store(false)
	n0 := calls.Load() // 0 when the hook panicked before the handler
	// Bounded, so that a leaked transaction fails the test instead of
	// hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != 201 {
		t.Fatalf("retry after the hook panicked: %d %s, want 201", rr.Code, rr.Body)
	}
	replayed := rr.Header().Get(idemhttp.ReplayedHeader) != ""
	n, effects := calls.Load(), e.effects(t, "hook")
	switch {
	case replayed && (n != 1 || n0 != 1 || effects != 1):
		t.Fatalf("replayed after %d executions and %d effects, want 1 and 1", n, effects)
	case !replayed && n != n0+1:
		t.Fatalf("handler ran %d times, %d before the retry: want the retry to execute", n, n0)
	case !replayed && mode == idemhttp.ModeTx && effects != 1:
		t.Fatalf("%d effects, want 1 (a first one rolled back)", effects)
	case !replayed && mode == idemhttp.ModeLease && effects != int(n):
		t.Fatalf("%d effects for %d executions", effects, n)
	}
}
