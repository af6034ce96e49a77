package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// endAfterClaim ends the request's context (end) right after the key is
// claimed: the race of a duplicate whose wait for the key's lock ends, the
// holder having rolled back, just as its own request ends (a server
// stopping, a client gone). Generic path: the record claim in the
// middleware's transaction.
type endAfterClaim[TTx any] struct {
	driver.RecordDriver[TTx]
	end func()
}

func (d endAfterClaim[TTx]) RecordsTx(tx TTx) driver.RecordExecutor {
	return endingExecutor{d.RecordDriver.RecordsTx(tx), d.end}
}

func (d endAfterClaim[TTx]) Records() driver.RecordExecutor {
	return endingExecutor{d.RecordDriver.Records(), d.end}
}

func (d endAfterClaim[TTx]) RollbackEnded(ctx context.Context, tx TTx) error {
	return d.RecordDriver.(driver.EndedRollbacker[TTx]).RollbackEnded(ctx, tx)
}

type endingExecutor struct {
	driver.RecordExecutor
	end func()
}

func (e endingExecutor) RecordClaim(ctx context.Context, p *driver.RecordClaimParams) (*driver.RecordClaimResult, error) {
	res, err := e.RecordExecutor.RecordClaim(ctx, p)
	if err == nil && res.Claimed {
		e.end()
	}
	return res, err
}

// endAfterBeginClaim is endAfterClaim for pgdriver's driver.TxClaimer path.
type endAfterBeginClaim struct {
	*pgdriver.Driver
	end func()
}

func (d endAfterBeginClaim) BeginClaim(ctx context.Context, p *driver.TxClaimParams) (pgx.Tx, *driver.TxClaimResult, error) {
	tx, res, err := d.Driver.BeginClaim(ctx, p)
	if err == nil && res.Locked {
		d.end()
	}
	return tx, res, err
}

// A request whose context ended as its key was claimed does not run the
// handler: it would run on a dead context (its statements failing, any
// effect outside the database done for a request answered 503). Seen as
// a flake of TestCancelledRequestIsAnswered (the duplicate's handler
// failing with "context already done"). It is answered 503 with
// Retry-After, and nothing is stored (ModeLease: the lease is released).
func TestClaimedAfterRequestEndedDoesNotExecute(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode idemhttp.Mode
		wrap func(base *pgdriver.Driver, end func()) driver.RecordDriver[pgx.Tx]
	}{
		{"generic", idemhttp.ModeTx, func(base *pgdriver.Driver, end func()) driver.RecordDriver[pgx.Tx] {
			return endAfterClaim[pgx.Tx]{base, end}
		}},
		{"txclaimer", idemhttp.ModeTx, func(base *pgdriver.Driver, end func()) driver.RecordDriver[pgx.Tx] {
			return endAfterBeginClaim{base, end}
		}},
		{"lease", idemhttp.ModeLease, func(base *pgdriver.Driver, end func()) driver.RecordDriver[pgx.Tx] {
			return endAfterClaim[pgx.Tx]{base, end}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			base := testdb.Postgres(t)
			var calls atomic.Int32
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			})
			serve := func(drv driver.RecordDriver[pgx.Tx], ctx context.Context) *httptest.ResponseRecorder {
				t.Helper()
				mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: tc.mode, ReplayCacheBytes: idemhttp.NoReplayCache})
				if err != nil {
					t.Fatal(err)
				}
				req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "ended-at-claim")
				w := httptest.NewRecorder()
				mw.Handler(handler).ServeHTTP(w, req)
				return w
			}
			w := serve(tc.wrap(base, cancel), ctx)
			if n := calls.Load(); n != 0 {
				t.Errorf("the handler ran %d times for a request whose context had ended; want 0", n)
			}
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
				t.Errorf("answer %d, Retry-After %q: %s; want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"), w.Body)
			}

			// Nothing was stored: the retry executes, once.
			if w := serve(base, context.Background()); w.Code != http.StatusCreated || calls.Load() != 1 {
				t.Errorf("retry: %d, the handler ran %d times in all; want 201 and once", w.Code, calls.Load())
			}
		})
	}
}
