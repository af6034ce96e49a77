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
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestScopeContextEndedIsNotUnauthenticated: a Scope hook that looks the
// principal up (an HMAC secret, an API key, in PostgreSQL) with the
// request's context, whose deadline passes (a timeout middleware in front
// of idem) or which is cancelled meanwhile, fails for no fault of the
// credentials. It was answered 401 unauthenticated with the hook's error
// as detail, which clients (idemclient) do not retry: the operation was
// dropped as if its credentials were wrong. It answers 503
// store-unavailable with Retry-After, as the other points where the
// request's context ends before the claim; nothing runs.
func TestScopeContextEndedIsNotUnauthenticated(t *testing.T) {
	t.Parallel()
	drv := testdb.Postgres(t)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want idemhttp.Outcome
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, idemhttp.OutcomeStoreError},
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, idemhttp.OutcomeAbandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			rr, o, calls := serveScoped(t, drv, ctx, func(r *http.Request) (string, error) {
				var principal string
				err := drv.Pool().QueryRow(r.Context(), `SELECT 'alice' FROM pg_sleep(5)`).Scan(&principal)
				return principal, err
			})
			checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			if rr.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
			if o != tc.want {
				t.Errorf("outcome %v, want %v", o, tc.want)
			}
			if calls != 0 {
				t.Fatalf("handler ran %d times", calls)
			}
		})
	}
}

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
			rr, o, calls := serveScoped(t, drv, context.Background(), tc.scope)
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
			if o != tc.want {
				t.Errorf("outcome %v, want %v", o, tc.want)
			}
			if calls != 0 {
				t.Fatalf("handler ran %d times", calls)
			}
		})
	}
}

// serveScoped sends one POST with a key through a middleware on drv whose
// Scope is scope, with ctx as the request's context, and returns the
// answer, the outcome reported, and how many times the handler ran.
func serveScoped[TTx any](t *testing.T, drv driver.RecordDriver[TTx], ctx context.Context, scope func(*http.Request) (string, error)) (*httptest.ResponseRecorder, idemhttp.Outcome, int64) {
	t.Helper()
	var calls atomic.Int64
	outc := make(chan idemhttp.Outcome, 2)
	mw, err := idemhttp.New(drv, &idemhttp.Config{
		Scope:     scope,
		OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outc <- o },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
	}))
	req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "k-1")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return rr, <-outc, calls.Load()
}
