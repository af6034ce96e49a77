package idemhttp_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// ctxHandler records, for each line, whether it was logged with the
// context of the request it is about (one carrying requestMark).
type ctxHandler struct {
	mu    *sync.Mutex
	lines map[string]bool // message: logged with the request's context
}

type requestMark struct{}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h ctxHandler) WithGroup(string) slog.Handler            { return h }
func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines[r.Message] = ctx != nil && ctx.Value(requestMark{}) != nil
	return nil
}

type failingBody struct{}

func (failingBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }
func (failingBody) Close() error             { return nil }

// The middleware's lines about a request are logged with its context (the
// Context variants of slog), so that a Logger's handler can read what the
// context carries: its span's trace and span IDs, for one.
func TestRequestLinesLoggedWithItsContext(t *testing.T) {
	t.Parallel()
	h := ctxHandler{mu: &sync.Mutex{}, lines: map[string]bool{}}
	mw, err := idemhttp.New(testdb.SQLite(t), &idemhttp.Config{
		Scope:            func(*http.Request) (string, error) { return "p", nil },
		Logger:           slog.New(h),
		MaxResponseBytes: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(strings.Repeat("x", 100))) // over MaxResponseBytes
	}))
	serve := func(key string, req *http.Request) {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.KeyHeader, key)
		srv.ServeHTTP(httptest.NewRecorder(), req.WithContext(context.WithValue(req.Context(), requestMark{}, true)))
	}
	req := httptest.NewRequest(http.MethodPost, "/things", nil)
	req.Body = failingBody{}
	serve("unreadable", req)
	serve("too-large", httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`)))

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, msg := range []string{"idemhttp: request body unreadable", "idemhttp: response too large to store"} {
		withCtx, logged := h.lines[msg]
		if !logged {
			t.Errorf("no %q line; lines: %v", msg, h.lines)
		} else if !withCtx {
			t.Errorf("%q logged without the request's context", msg)
		}
	}
}
