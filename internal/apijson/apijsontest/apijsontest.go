// Package apijsontest checks how a JSON endpoint of idemd answers bad
// requests on its own (without the idempotency middleware in front): a
// missing or wrong Content-Type, a body over its limit, a connection that
// breaks mid-body. The payments and orders handlers share these answers
// through package apijson, and their tests share this check.
package apijsontest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/problem"
)

// Endpoint is the handler under test.
type Endpoint struct {
	// New returns the handler's create function, logging to log.
	New func(log *slog.Logger) http.HandlerFunc
	// Path is the request path (for the request only).
	Path string
	// MaxBytes is the endpoint's body limit.
	MaxBytes int
	// Secret is the start of a body with values that must never be
	// logged: the connection breaks after it.
	Secret string
	// Leaks are the values of Secret that must not appear in the log.
	Leaks []string
}

func (e Endpoint) call(t *testing.T, contentType string, body io.Reader) (*httptest.ResponseRecorder, problem.Problem, string) {
	t.Helper()
	var logs bytes.Buffer
	req := httptest.NewRequest(http.MethodPost, e.Path, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	e.New(slog.New(slog.NewTextHandler(&logs, nil)))(rec, req)
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	return rec, p, logs.String()
}

// BrokenBody returns a request body that yields start, then fails as a
// connection the client reset (a *net.OpError naming socket addresses).
func BrokenBody(start io.Reader) io.ReadCloser { return &resetReader{start} }

type resetReader struct{ start io.Reader }

func (r *resetReader) Close() error { return nil }

func (r *resetReader) Read(b []byte) (int, error) {
	if n, _ := r.start.Read(b); n > 0 {
		return n, nil
	}
	return 0, &net.OpError{Op: "read", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080},
		Addr:   &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555},
		Err:    syscall.ECONNRESET}
}

// Run checks the endpoint's answers to bad requests.
func Run(t *testing.T, e Endpoint) {
	t.Run("ContentType", func(t *testing.T) {
		for _, ct := range []string{"", "text/plain", "application/jsonx"} {
			rec, p, _ := e.call(t, ct, strings.NewReader(`{}`))
			if rec.Code != http.StatusUnsupportedMediaType || p.Title != "Unsupported Media Type" {
				t.Errorf("Content-Type %q: %d %s, want 415", ct, rec.Code, rec.Body)
			}
		}
	})
	t.Run("TooLarge", func(t *testing.T) {
		rec, p, _ := e.call(t, "application/json", strings.NewReader(strings.Repeat(" ", e.MaxBytes+1)))
		if rec.Code != http.StatusRequestEntityTooLarge || p.Type != problem.TypeBodyTooLarge ||
			p.Title != "Request body too large" || p.Detail != fmt.Sprintf("The body exceeds %d bytes.", e.MaxBytes) {
			t.Errorf("%d %s, want idemhttp's 413 body-too-large", rec.Code, rec.Body)
		}
	})
	// The network error is logged, never sent; the body is never logged.
	t.Run("BrokenBody", func(t *testing.T) {
		rec, p, logs := e.call(t, "application/json", &resetReader{strings.NewReader(e.Secret)})
		if rec.Code != http.StatusBadRequest || p.Type != problem.TypeValidation || p.Title != "Unreadable request body" {
			t.Errorf("%d %s, want a 400 unreadable body", rec.Code, rec.Body)
		}
		for _, leak := range []string{"127.0.0.1", "tcp", "5555", "reset"} {
			if strings.Contains(rec.Body.String(), leak) {
				t.Errorf("the problem contains %q: %s", leak, rec.Body)
			}
		}
		if !strings.Contains(logs, "connection reset") {
			t.Errorf("the log lacks the cause:\n%s", logs)
		}
		for _, leak := range e.Leaks {
			if strings.Contains(logs, leak) {
				t.Errorf("the log contains %q:\n%s", leak, logs)
			}
		}
	})
}
