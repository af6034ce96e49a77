package idemhttp_test

import (
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// TestNotMigrated: the operator forgot Migrate, or gave the driver another
// Schema or TablePrefix than the one migrated. idem's tables are missing:
// retrying cannot help, so the middleware answers 500 store-unavailable
// without Retry-After (not the 503 a client would retry for ever), never
// runs the handler, and logs an ERROR naming the table and the fix.
func TestNotMigrated(t *testing.T) {
	backends := []struct {
		name  string
		table string
		new   func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error)
	}{
		{"postgres/unmigrated", `idempotency_record`, func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
			pool, schema := testdb.Schema(t, 4)
			drv, err := pgdriver.New(pool, &pgdriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			mw, err := idemhttp.New(drv, cfg)
			return handlerOf(mw), err
		}},
		{"postgres/wrong-prefix", `other_idempotency_record`, func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
			migrated := testdb.Postgres(t)
			drv, err := pgdriver.New(migrated.Pool(), &pgdriver.Config{TablePrefix: "other_"})
			if err != nil {
				t.Fatal(err)
			}
			mw, err := idemhttp.New(drv, cfg)
			return handlerOf(mw), err
		}},
		{"postgres/wrong-schema", `no_such_schema`, func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
			migrated := testdb.Postgres(t)
			drv, err := pgdriver.New(migrated.Pool(), &pgdriver.Config{Schema: "no_such_schema"})
			if err != nil {
				t.Fatal(err)
			}
			mw, err := idemhttp.New(generic[pgx.Tx]{drv}, cfg) // the generic ModeTx path
			return handlerOf(mw), err
		}},
		{"postgres-sql/unmigrated", `idempotency_record`, func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
			db, schema := testdb.SQLDB(t, 4)
			drv, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			mw, err := idemhttp.New(drv, cfg)
			return handlerOf(mw), err
		}},
		{"sqlite/unmigrated", `no such table: idempotency_record`, func(t *testing.T, cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
			drv, err := sqlitedriver.Open(testdb.SQLitePath(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = drv.Close() })
			mw, err := idemhttp.New(drv, cfg)
			return handlerOf(mw), err
		}},
	}
	for _, b := range backends {
		for _, mode := range []idemhttp.Mode{idemhttp.ModeTx, idemhttp.ModeLease} {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				var logs testlog.Buffer
				wrap, err := b.new(t, &idemhttp.Config{Mode: mode, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				var calls atomic.Int64
				h := wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					w.WriteHeader(http.StatusCreated)
				}))
				rr := send(h, "POST", "/pay", "k1", `{}`)
				checkProblem(t, rr, http.StatusInternalServerError, problem.TypeStoreUnavailable)
				if ra := rr.Header().Get("Retry-After"); ra != "" {
					t.Errorf("Retry-After = %q; want none, retrying cannot help", ra)
				}
				if body := rr.Body.String(); strings.Contains(body, b.table) || strings.Contains(body, "Migrate") {
					t.Errorf("the public detail names the server's configuration: %s", body)
				}
				if calls.Load() != 0 {
					t.Errorf("the handler ran %d times; want 0", calls.Load())
				}
				log := logs.String()
				for _, want := range []string{"level=ERROR", "run the driver's Migrate", b.table, driver.ErrNotMigrated.Error()} {
					if !strings.Contains(log, want) {
						t.Errorf("log lacks %q:\n%s", want, log)
					}
				}
				if strings.Contains(log, "store unavailable") {
					t.Errorf("logged as a store outage:\n%s", log)
				}
			})
		}
	}
}

func handlerOf[TTx any](mw *idemhttp.Middleware[TTx]) func(http.Handler) http.Handler {
	if mw == nil {
		return nil
	}
	return mw.Handler
}
