package idemclient_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/problem"
)

// A server's Retry-After longer than MaxDelay is honoured in full: MaxDelay
// bounds the client's own backoff, and retrying sooner than the server
// asked only adds load to a server that said it cannot serve until then.
func TestRetryAfterNotCappedByMaxDelay(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "30")
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c, s := newClient(t, &idemclient.Config{MaxDelay: time.Second})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	resp.Body.Close()
	if ds := s.delays(); len(ds) != 1 || !jittered(ds[0], 30*time.Second) {
		t.Errorf("delays %v, want [30s] plus its jitter: the server's Retry-After, not MaxDelay", ds)
	}
	checkSameKeyAndBody(t, rec.seen(), "{}")
}

// A Retry-After longer than the client will wait ends Do at once with a
// *RetryAfterError: no retry sooner than the server asked (which a cap at
// MaxDelay did, four times in a row), and no sleep in vain. (Past the
// context's deadline or MaxElapsed: TestDeadlineGivesUpEarly.)
func TestRetryAfterTooLongStops(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		header string
		cfg    idemclient.Config
		want   time.Duration // the wait asked for, 0: about 2h
		limit  string
	}{
		{"beyond default MaxRetryAfter", "3600", idemclient.Config{}, time.Hour, "MaxRetryAfter 1m0s"},
		{"huge", "99999999999999999999", idemclient.Config{}, (1 << 32) * time.Second, "MaxRetryAfter 1m0s"},
		{"HTTP-date", "date+2h", idemclient.Config{}, 0, "MaxRetryAfter 1m0s"},
		{"beyond MaxRetryAfter", "3", idemclient.Config{MaxRetryAfter: 2 * time.Second}, 3 * time.Second, "MaxRetryAfter 2s"},
		{"beyond MaxDelay, default MaxRetryAfter", "100", idemclient.Config{MaxDelay: 90 * time.Second}, 100 * time.Second, "MaxRetryAfter 1m30s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				ra := tt.header
				if ra == "date+2h" {
					ra = time.Now().Add(2 * time.Hour).UTC().Format(http.TimeFormat)
				}
				writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, ra)
			})
			cfg := tt.cfg
			c, s := newClient(t, &cfg)
			before := time.Now()
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("Do returned %d; want an error saying the server asked to retry later", resp.StatusCode)
			}
			if n := len(rec.seen()); n != 1 || len(s.delays()) != 0 {
				t.Errorf("%d attempts, waits %v; want 1 attempt and no wait", n, s.delays())
			}
			var e *idemclient.Error
			var ra *idemclient.RetryAfterError
			if !errors.As(err, &e) || !errors.As(err, &ra) || !errors.Is(err, idemclient.ErrRetryAfter) {
				t.Fatalf("err %v, want an *Error with a *RetryAfterError", err)
			}
			key := checkSameKeyAndBody(t, rec.seen(), "{}")
			if e.Key != key || e.Attempts != 1 {
				t.Errorf("Error %+v; want the key sent and 1 attempt", e)
			}
			if ra.StatusCode != http.StatusServiceUnavailable || ra.ProblemType != problem.TypeStoreUnavailable || ra.Limit != tt.limit {
				t.Errorf("RetryAfterError %+v", ra)
			}
			want := tt.want
			if want == 0 {
				if ra.RetryAfter < 2*time.Hour-2*time.Second || ra.RetryAfter > 2*time.Hour {
					t.Errorf("RetryAfter %s, want about 2h", ra.RetryAfter)
				}
				want = ra.RetryAfter
			} else if ra.RetryAfter != want {
				t.Errorf("RetryAfter %s, want %s", ra.RetryAfter, want)
			}
			if at := before.Add(want); ra.At.Before(at) || ra.At.After(at.Add(time.Second)) {
				t.Errorf("At %s, want about %s", ra.At, at)
			}
			if msg := err.Error(); !strings.Contains(msg, "asks to retry in") || !strings.Contains(msg, tt.limit) {
				t.Errorf("message %q", msg)
			}
		})
	}
}

// The response Do stops at is drained and closed: its connection is reused.
func TestRetryAfterTooLongDrains(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "3600")
		http.Error(w, strings.Repeat("busy ", 1000), http.StatusServiceUnavailable)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, _ := newClient(t, &idemclient.Config{HTTPClient: &http.Client{Transport: tr, Timeout: 5 * time.Second}})
	for range 3 {
		if _, err := c.Do(post(t, srv.URL, "{}")); !errors.Is(err, idemclient.ErrRetryAfter) {
			t.Fatalf("err %v", err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests; want 1 (the response drained and closed)", n)
	}
}

// A backoff of the client's own (no Retry-After) that would end past the
// budget still gives up with the last response, as documented.
func TestBackoffPastBudgetReturnsResponse(t *testing.T) {
	t.Parallel()
	srv, rec := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusServiceUnavailable, problem.TypeStoreUnavailable, "")
	})
	c, s := newClient(t, &idemclient.Config{Backoff: func(int) time.Duration { return 5 * time.Second }, MaxElapsed: 3 * time.Second})
	resp, err := c.Do(post(t, srv.URL, "{}"))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || len(rec.seen()) != 1 || len(s.delays()) != 0 {
		t.Errorf("status %d, %d attempts, waits %v", resp.StatusCode, len(rec.seen()), s.delays())
	}
}

// A Retry-After HTTP-date is read on the server's clock, against the
// response's Date: a server whose clock is off by an hour asks for the
// same 5 s wait as one whose clock is right, and gets it, neither a retry
// at once (its clock behind) nor a wait of an hour (ahead).
func TestRetryAfterHTTPDateServerClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-time.Hour, time.Hour, 0} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			srv, _ := server(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					now := time.Now().Add(skew).UTC()
					w.Header().Set("Date", now.Format(http.TimeFormat))
					w.Header().Set("Retry-After", now.Add(5*time.Second).Format(http.TimeFormat))
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			c, s := newClient(t, &idemclient.Config{Backoff: func(int) time.Duration { return time.Millisecond }})
			resp, err := c.Do(post(t, srv.URL, "{}"))
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			resp.Body.Close()
			if ds := s.delays(); len(ds) != 1 || ds[0] < 4*time.Second || ds[0] > 5500*time.Millisecond {
				t.Errorf("delays %v, want one of 4-5s, plus at most a tenth of it", ds)
			}
		})
	}
}
