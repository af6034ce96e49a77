package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// The operation is still running on the server (the real idemhttp on
// SQLite answers 409 request-in-progress with a Retry-After of 10s), and
// that wait is more than Do may make: past the context's deadline, past
// MaxRetryAfter, past MaxElapsed. Do stops at once with a
// *RetryAfterError, which is also ErrInProgress: the package documents
// ErrInProgress for a Do that ran out of time for another attempt while the
// operation was still in progress, and a caller branching on it (still
// running, not failed) must see it whichever limit cut the wait.
func TestInProgressPastLimitIsErrInProgress(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait, RetryAfter: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	var executions atomic.Int32
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		executions.Add(1)
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Handler(slow))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(unblock) // runs before srv.Close: never leave the handler blocked

	key := startFirst(t, srv.URL+"/charges", &executions, unblock)

	for _, tc := range []struct {
		name    string
		cfg     idemclient.Config
		timeout time.Duration
	}{
		{"deadline", idemclient.Config{}, 5 * time.Second},
		{"MaxRetryAfter", idemclient.Config{MaxRetryAfter: 2 * time.Second}, 0},
		{"MaxElapsed", idemclient.Config{MaxElapsed: 5 * time.Second}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := newClient(t, &tc.cfg)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(`{}`))
			req, _ = idemclient.WithKey(req, key)
			resp, err := c.Do(req)
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("response %d; want an error", resp.StatusCode)
			}
			var ra *idemclient.RetryAfterError
			if !errors.As(err, &ra) || ra.StatusCode != http.StatusConflict || ra.ProblemType != problem.TypeRequestInProgress || ra.RetryAfter != 10*time.Second {
				t.Fatalf("Do: %v; want a *RetryAfterError of the 409 request-in-progress", err)
			}
			if !errors.Is(err, idemclient.ErrInProgress) || !errors.Is(err, idemclient.ErrRetryAfter) {
				t.Errorf("Do: %v: ErrInProgress %v, ErrRetryAfter %v; want both", err,
					errors.Is(err, idemclient.ErrInProgress), errors.Is(err, idemclient.ErrRetryAfter))
			}
			var e *idemclient.Error
			if !errors.As(err, &e) || e.Key != key || e.Attempts != 1 || len(s.delays()) != 0 {
				t.Errorf("Do: %#v after waits %v; want an *Error with the key, after 1 attempt and no wait", err, s.delays())
			}
		})
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// A 429 or 503 whose Retry-After is more than Do may wait is no operation
// in progress: ErrRetryAfter only.
func TestRetryAfterTooLongNotInProgress(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		srv, _ := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, status, problem.TypeStoreUnavailable, "120")
		})
		c, _ := newClient(t, nil)
		resp, err := c.Do(post(t, srv.URL, "{}"))
		if resp != nil {
			resp.Body.Close()
		}
		if !errors.Is(err, idemclient.ErrRetryAfter) || errors.Is(err, idemclient.ErrInProgress) {
			t.Errorf("%d: %v; want ErrRetryAfter, not ErrInProgress", status, err)
		}
	}
}

// The context ends while Do waits for the operation the server last
// answered 409 request-in-progress for: during the attempt after it (the
// usual case: idemhttp holds a duplicate up to its Wait before answering),
// or during the wait before it. Do ran out of time while the operation was
// in progress: the error is ErrInProgress as well as the context's.
func TestInProgressContextEndsIsErrInProgress(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	var executions atomic.Int32
	protected := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		executions.Add(1)
		<-release
		w.WriteHeader(http.StatusAccepted)
	}))
	var hold atomic.Bool // hold the next request until its client is gone
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold.CompareAndSwap(true, false) {
			_, _ = io.Copy(io.Discard, r.Body) // then net/http sees the client go
			<-r.Context().Done()
			return
		}
		protected.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(unblock)

	key := startFirst(t, srv.URL, &executions, unblock)

	t.Run("during the attempt", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the 409 comes well before
		defer cancel()
		c, _ := newClient(t, &idemclient.Config{
			Sleep: func(ctx context.Context, _ time.Duration) error {
				hold.Store(true) // the next attempt outlives the context
				return ctx.Err()
			},
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req, _ = idemclient.WithKey(req, key)
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("response %d; want an error", resp.StatusCode)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idemclient.ErrInProgress) {
			t.Errorf("Do: %v: DeadlineExceeded %v, ErrInProgress %v; want both", err,
				errors.Is(err, context.DeadlineExceeded), errors.Is(err, idemclient.ErrInProgress))
		}
	})
	t.Run("during the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, _ := newClient(t, &idemclient.Config{
			Sleep: func(ctx context.Context, _ time.Duration) error {
				cancel() // the caller gives up while Do waits
				<-ctx.Done()
				return ctx.Err()
			},
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req, _ = idemclient.WithKey(req, key)
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("response %d; want an error", resp.StatusCode)
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, idemclient.ErrInProgress) {
			t.Errorf("Do: %v: Canceled %v, ErrInProgress %v; want both", err,
				errors.Is(err, context.Canceled), errors.Is(err, idemclient.ErrInProgress))
		}
	})
	if n := executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// startFirst sends a first request to url with a new key, outside the
// client under test, and returns the key once its handler runs (executions
// moved). The request ends when unblock releases the handler, at the
// latest when the test ends.
func startFirst(t *testing.T, url string, executions *atomic.Int32, unblock func()) string {
	t.Helper()
	key, _ := idemclient.NewKey()
	first, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	first, _ = idemclient.WithKey(first, key)
	firstDone := make(chan struct{})
	var answer string // what the first request got, once firstDone is closed
	go func() {
		defer close(firstDone)
		resp, err := http.DefaultClient.Do(first)
		if err != nil {
			answer = err.Error()
			t.Errorf("first: %v", err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer = fmt.Sprintf("%d %s", resp.StatusCode, body)
	}()
	t.Cleanup(func() { unblock(); <-firstDone })
	// Generous: under the whole suite on 2 busy cores, a claim on a new
	// SQLite file has taken seconds.
	deadline := time.After(60 * time.Second)
	for executions.Load() == 0 {
		select {
		case <-firstDone:
			if executions.Load() == 0 {
				t.Fatalf("the first request was answered without running the handler: %s", answer)
			}
		case <-deadline:
			t.Fatal("the first request never started")
		case <-time.After(time.Millisecond):
		}
	}
	return key
}
