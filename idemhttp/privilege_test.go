package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// TestPrivilegeRevoked: a migration or a DBA revoked the application
// role's privileges on idem's tables (42501 insufficient_privilege), as a
// login refused after a password rotation (class 28) refuses it every
// connection. Retrying cannot help until an operator grants them again,
// as when idem's tables are missing: the middleware answers 500
// store-unavailable without Retry-After (not the 503 a client would retry
// for ever), executes nothing, and logs an ERROR that says what to fix.
func TestPrivilegeRevoked(t *testing.T) {
	for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			owner, schema := migratedSchema(t)
			app := testdb.DMLPool(t, owner, schema)
			drv, err := pgdriver.New(app, &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := owner.Exec(context.Background(), `REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` FROM `+schema+`_dml`); err != nil {
				t.Fatal(err)
			}
			var logs testlog.Buffer
			mw, err := idemhttp.New(drv, &idemhttp.Config{Mode: mode, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			rr := send(h, "POST", "/pay", "k1", `{}`)
			checkProblem(t, rr, http.StatusInternalServerError, problem.TypeStoreUnavailable)
			if ra := rr.Header().Get("Retry-After"); ra != "" {
				t.Errorf("Retry-After = %q; want none, retrying cannot help", ra)
			}
			if strings.Contains(rr.Body.String(), "permission") {
				t.Errorf("the public detail names the server's configuration: %s", rr.Body)
			}
			if n := calls.Load(); mode == idemhttp.ModeLease && n != 0 {
				t.Errorf("the handler ran %d times; want 0", n)
			}
			var records int
			if err := owner.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_record`).Scan(&records); err != nil || records != 0 {
				t.Errorf("%d records stored (%v); want 0", records, err)
			}
			log := logs.String()
			for _, want := range []string{"level=ERROR", "grant the role", "permission denied for table idempotency_record"} {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks %q:\n%s", want, log)
				}
			}
			if strings.Contains(log, "store unavailable") || strings.Contains(log, "result unknown") {
				t.Errorf("logged as a store outage or an unknown outcome:\n%s", log)
			}
		})
	}
}

// migratedSchema creates a schema with idem's tables migrated, and returns
// it with a pool of its owner (2 connections).
func migratedSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	owner, schema := testdb.Schema(t, 2)
	mig, err := pgdriver.New(owner, &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return owner, schema
}
