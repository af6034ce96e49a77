package idemhttp_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
)

// bouncerEnv is a ModeTx env on drv, a pgdriver whose pool goes through
// PgBouncer; its tables are named with their schema (PgBouncer passes no
// search_path on).
func bouncerEnv(t *testing.T, drv *pgdriver.Driver, schema string) *env {
	effect := pgx.Identifier{schema, "effect"}.Sanitize()
	if _, err := drv.Pool().Exec(t.Context(), `CREATE TABLE IF NOT EXISTS `+effect+` (label text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{
		name: "postgres-pgbouncer",
		wrap: func(t *testing.T, cfg *idemhttp.Config, h http.Handler) http.Handler {
			mw, err := idemhttp.New(drv, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return mw.Handler(h)
		},
		effect: func(r *http.Request, label string) error {
			tx, _ := idemhttp.TxFromContext[pgx.Tx](r.Context())
			_, err := tx.Exec(r.Context(), `INSERT INTO `+effect+` (label) VALUES ($1)`, label)
			return err
		},
		effects: func(t *testing.T, label string) int {
			var n int
			if err := drv.Pool().QueryRow(t.Context(), `SELECT count(*) FROM `+effect+` WHERE label = $1`, label).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// Behind PgBouncer in transaction pooling mode, with two middlewares on
// two pools (two replicas): concurrent duplicates execute once; a command
// that failed (500, rolled back) leaves its key free, and its retry
// executes at once and is then replayed. Before pgdriver kept its claims'
// locks in their transactions there, a failed command's lock stayed with
// a server connection of PgBouncer, and its retries were answered 409 in
// progress until PgBouncer closed that connection.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncer(t)
	a, schema := testdb.PostgresBehindPgBouncer(t, bouncer, nil)
	b, err := pgdriver.New(testdb.BouncerPool(t, bouncer, 10), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ea, eb := bouncerEnv(t, a, schema), bouncerEnv(t, b, schema)
	cfg := &idemhttp.Config{Mode: idemhttp.ModeTx, Wait: time.Minute}

	t.Run("duplicates", func(t *testing.T) {
		var calls atomic.Int64
		ha := ea.wrap(t, cfg, slowEffect(t, ea, &calls, 30*time.Millisecond))
		hb := eb.wrap(t, cfg, slowEffect(t, eb, &calls, 30*time.Millisecond))
		checkExactlyOnce(t, ea, &calls, hammer(100, ha, hb), false)
	})

	// Concurrent retries of a completed request with NoWait (no replay
	// cache: each reads the store) are all replayed. Behind a pooler every
	// claim takes the key's lock, a replay's too, for a moment: a retry
	// finding it taken by another retry answered 409 request-in-progress.
	t.Run("concurrent replays", func(t *testing.T) {
		var calls atomic.Int64
		cfg := &idemhttp.Config{Mode: idemhttp.ModeTx, Wait: idemhttp.NoWait, ReplayCacheBytes: idemhttp.NoReplayCache}
		ha := ea.wrap(t, cfg, effectHandler(t, ea, 201, &calls))
		hb := eb.wrap(t, cfg, effectHandler(t, eb, 201, &calls))
		if rr := send(ha, "POST", "/pay?label=r", "replayed-key", `{"amount":"1.00"}`); rr.Code != http.StatusCreated {
			t.Fatalf("first request: %d %s", rr.Code, rr.Body)
		}
		notReplayed := 0
		for range 3 {
			for _, rr := range hammerKey(40, "replayed-key", "r", ha, hb) {
				if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
					notReplayed++
				}
			}
		}
		if notReplayed > 0 || calls.Load() != 1 {
			t.Fatalf("%d of 120 concurrent retries of a completed request not answered with its replay; handler calls %d, want 1", notReplayed, calls.Load())
		}
	})

	t.Run("retry after a failure", func(t *testing.T) {
		var calls atomic.Int64
		fail := true
		h := ea.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeTx, Wait: idemhttp.NoWait}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := ea.effect(r, "f"); err != nil {
				t.Errorf("effect: %v", err)
			}
			if fail {
				http.Error(w, "try again", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		testdb.Churn(t, b.Pool()) // PgBouncer moves each request's statements between its server connections
		const n = 40
		for i := range n {
			fail = true
			key := "retry-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			if rr := send(h, "POST", "/pay", key, `{}`); rr.Code != http.StatusServiceUnavailable {
				t.Fatalf("%s: first attempt answered %d, want the handler's 503", key, rr.Code)
			}
			fail = false
			if rr := send(h, "POST", "/pay", key, `{}`); rr.Code != http.StatusCreated {
				t.Fatalf("%s: the retry of a failed command answered %d (%s), want 201: executed", key, rr.Code, rr.Body)
			}
			if rr := send(h, "POST", "/pay", key, `{}`); rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("%s: the second retry answered %d, replayed %q; want the stored 201", key, rr.Code, rr.Header().Get(idemhttp.ReplayedHeader))
			}
		}
		if got, want := calls.Load(), int64(2*n); got != want {
			t.Errorf("handler calls = %d, want %d (two per key: the failure and the retry)", got, want)
		}
		if got := ea.effects(t, "f"); got != n {
			t.Errorf("effects = %d, want %d (the failures' rolled back)", got, n)
		}
	})
}
