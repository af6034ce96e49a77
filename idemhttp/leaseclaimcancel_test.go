package idemhttp_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// lostClaimDriver is pgdriver whose lease claims commit and then lose
// their answer to the request's end: the client's timeout fired, or it
// went away, after PostgreSQL committed the claim's INSERT and before pgx
// read the reply (the claim returns the context's error).
type lostClaimDriver struct {
	*pgdriver.Driver
	endRequest func() // ends the request's context
	lose       atomic.Bool
	released   chan struct{} // gets one value per RecordRelease
}

func (d *lostClaimDriver) Records() driver.RecordExecutor {
	return lostClaimExecutor{RecordExecutor: d.Driver.Records(), d: d}
}

type lostClaimExecutor struct {
	driver.RecordExecutor
	d *lostClaimDriver
}

func (e lostClaimExecutor) RecordRelease(ctx context.Context, p *driver.RecordReleaseParams) error {
	err := e.RecordExecutor.RecordRelease(ctx, p)
	e.d.released <- struct{}{}
	return err
}

func (e lostClaimExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	if !e.d.lose.Load() {
		return e.RecordExecutor.RecordClaim(ctx, p)
	}
	res, err := e.RecordExecutor.RecordClaim(context.WithoutCancel(ctx), p)
	if err != nil || !res.Claimed {
		return res, err
	}
	e.d.endRequest()
	<-ctx.Done()
	return nil, ctx.Err()
}

// A ModeLease claim whose reply was lost because the request ended (the
// client went away, or its deadline passed) had committed an in-progress
// record that nothing would complete or release: the client's retry with
// the same key got 409 request-in-progress until the lease expired (30 s
// by default), though the handler never ran. The claim is released.
func TestLeaseClaimLostToTheRequestsEnd(t *testing.T) {
	t.Parallel()
	for _, cause := range []string{"client gone", "deadline"} {
		t.Run(cause, func(t *testing.T) {
			t.Parallel()
			drv := &lostClaimDriver{Driver: testdb.Postgres(t), released: make(chan struct{}, 1)}
			var calls atomic.Int64
			mw, err := idemhttp.New[pgx.Tx](drv, &idemhttp.Config{Mode: idemhttp.ModeLease, Wait: idemhttp.NoWait})
			if err != nil {
				t.Fatal(err)
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"charged":true}`))
			}))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			drv.endRequest = cancel
			if cause == "deadline" {
				// A timeout middleware's deadline passes during the claim.
				ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				drv.endRequest = func() {}
			}
			drv.lose.Store(true)
			req := httptest.NewRequest("POST", "/charge", strings.NewReader(`{}`)).WithContext(ctx)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "k")
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			if cause == "deadline" {
				checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			}
			if calls.Load() != 0 {
				t.Fatalf("the handler ran %d times on a request that ended during its claim", calls.Load())
			}

			select { // the release runs in the background
			case <-drv.released:
			case <-time.After(10 * time.Second):
				t.Fatal("the lost claim was not released")
			}
			drv.lose.Store(false)
			retry := send(h, "POST", "/charge", "k", `{}`)
			if retry.Code != http.StatusCreated || retry.Header().Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("retry with the same key: %d %s; want the command executed (201)", retry.Code, retry.Body)
			}
			if calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", calls.Load())
			}
		})
	}
}

// The same with the client still there: the claim's INSERT committed and
// the connection broke before its reply arrived (the proxy drops the reply
// and closes the connection). The request answers 503 store-unavailable,
// and the in-progress record its claim left made every retry answer 409
// request-in-progress for the whole lease, though the handler never ran.
// The claim is released, by its token, in the background: a retry that
// waits executes.
func TestLeaseClaimReplyLost(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedPostgres(t)
	var calls atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charged":true}`))
	})
	mw, err := idemhttp.New[pgx.Tx](proxied, &idemhttp.Config{Mode: idemhttp.ModeLease, Scope: fixedScope, Wait: idemhttp.NoWait})
	if err != nil {
		t.Fatal(err)
	}
	key := randomMarker("lcl-") // in the claim's bytes only
	f := proxy.Arm(testdb.DropReply, func(b []byte) bool { return bytes.Contains(b, []byte(key)) })
	rr := send(mw.Handler(handler), "POST", "/charge", key, `{}`)
	select {
	case <-f.Fired():
	default:
		t.Fatalf("the fault did not fire; answer %d %s", rr.Code, rr.Body)
	}
	checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
	if calls.Load() != 0 {
		t.Fatalf("the handler ran %d times on a request whose claim failed", calls.Load())
	}

	// A retry, on another instance, waits for the key (5 s, far less than
	// the 30 s lease): the claim left behind is released meanwhile.
	other, err := idemhttp.New[pgx.Tx](direct, &idemhttp.Config{Mode: idemhttp.ModeLease, Scope: fixedScope, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	retry := send(other.Handler(handler), "POST", "/charge", key, `{}`)
	if retry.Code != http.StatusCreated || retry.Header().Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("retry with the same key: %d %s; want the command executed (201)", retry.Code, retry.Body)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}
