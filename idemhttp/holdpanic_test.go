package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/observe/observetest"
)

// endCounter is an observetest.Recorder that counts the End calls of
// each span it starts.
type endCounter struct {
	rec  observetest.Recorder
	mu   sync.Mutex
	ends map[string][]*int // span name -> End calls of each span
}

func (t *endCounter) Start(ctx context.Context, name string, attrs ...observe.Attr) (context.Context, observe.Span) {
	ctx, s := t.rec.Start(ctx, name, attrs...)
	n := new(int)
	t.mu.Lock()
	if t.ends == nil {
		t.ends = map[string][]*int{}
	}
	t.ends[name] = append(t.ends[name], n)
	t.mu.Unlock()
	return ctx, &countedSpan{Span: s, t: t, n: n}
}

type countedSpan struct {
	observe.Span
	t *endCounter
	n *int
}

func (s *countedSpan) End() {
	s.t.mu.Lock()
	*s.n++
	s.t.mu.Unlock()
	s.Span.End()
}

// A handler that panics, and then the hold guard's own work (here the
// OnOutcome hook it calls to report the outcome not stored) panics too:
// the idem.http.execute span was never ended (an exporter kept it open,
// and its trace had a span without an end), though the request span was.
// Every span started must end exactly once, and the panic goes on.
func TestHoldGuardPanicEndsSpans(t *testing.T) {
	t.Parallel()
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			tr := &endCounter{}
			mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{
				Mode:   mode,
				Tracer: tr,
				OnOutcome: func(_ *http.Request, o idemhttp.Outcome) {
					if o == idemhttp.OutcomeNotStored {
						panic("outcome hook bug")
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
			req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "k1")
			func() {
				defer func() {
					if recover() == nil {
						t.Error("panic swallowed: the server must still see it")
					}
				}()
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.ends["idem.http.execute"]) != 1 {
				t.Fatalf("%d idem.http.execute spans; want 1", len(tr.ends["idem.http.execute"]))
			}
			for name, ns := range tr.ends {
				for i, n := range ns {
					if *n != 1 {
						t.Errorf("span %s #%d ended %d times; want 1", name, i, *n)
					}
				}
			}
			if s := tr.rec.Named("idem.http.execute")[0]; s.Err() == nil || !strings.Contains(s.Err().Error(), "panic") {
				t.Errorf("idem.http.execute error %v; want the panic", s.Err())
			}
		})
	}
}
