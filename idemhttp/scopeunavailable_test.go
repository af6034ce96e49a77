package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestScopeLookupUnavailable: a Scope hook whose lookup of the principal
// cannot be made now (its database refuses connections; a key store
// returning idemhttp.ErrScopeUnavailable) was answered 401 unauthenticated
// with the hook's error as detail: clients drop a 401 as bad credentials,
// and the detail gave the lookup's address away. It answers 503
// store-unavailable with Retry-After and a detail of its own; a hook
// that refuses the credentials still answers 401 with its text.
func TestScopeLookupUnavailable(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	for _, tc := range []struct {
		name       string
		scope      func(r *http.Request) (string, error)
		status     int
		typ        string
		want       idemhttp.Outcome
		detailHas  string
		detailLeak string
	}{
		{"database refuses connections", func(r *http.Request) (string, error) {
			conn, err := pgx.Connect(r.Context(), "postgres://postgres@127.0.0.1:1/secrets?sslmode=disable&connect_timeout=2")
			if err != nil {
				return "", fmt.Errorf("api key lookup: %w", err)
			}
			defer func() { _ = conn.Close(context.Background()) }()
			return "alice", nil
		}, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, idemhttp.OutcomeStoreError, "", "127.0.0.1:1"},
		{"ErrScopeUnavailable", func(*http.Request) (string, error) {
			return "", fmt.Errorf("redis 10.0.0.7:6379: i/o timeout: %w", idemhttp.ErrScopeUnavailable)
		}, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, idemhttp.OutcomeStoreError, "", "10.0.0.7"},
		{"credentials refused", func(*http.Request) (string, error) {
			return "", errors.New("unknown API key")
		}, http.StatusUnauthorized, problem.TypeUnauthenticated, idemhttp.OutcomeRejected, "unknown API key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			outc := make(chan idemhttp.Outcome, 2)
			mw, err := idemhttp.New(drv, &idemhttp.Config{
				Scope:     tc.scope,
				OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outc <- o },
			})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(201)
			}))
			req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "k-1")
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			body := rr.Body.String()
			checkProblem(t, rr, tc.status, tc.typ)
			if tc.status == http.StatusServiceUnavailable && rr.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
			if tc.detailHas != "" && !strings.Contains(body, tc.detailHas) {
				t.Errorf("body %s does not say %q", body, tc.detailHas)
			}
			if tc.detailLeak != "" && strings.Contains(body, tc.detailLeak) {
				t.Errorf("body %s gives the lookup's %q away", body, tc.detailLeak)
			}
			if o := <-outc; o != tc.want {
				t.Errorf("outcome %v, want %v", o, tc.want)
			}
			if calls.Load() != 0 {
				t.Fatalf("handler ran %d times", calls.Load())
			}
		})
	}
}
