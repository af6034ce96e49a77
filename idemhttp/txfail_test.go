package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/problem"
)

// TestHandlerStatementFailureAbortsTx: a handler whose statement fails (a
// unique violation on its own table, no savepoint) and that answers a
// stored status anyway: on PostgreSQL the transaction is aborted, nothing
// is committed, and idem answers 500 transaction-aborted (not 503
// outcome-unknown, which would tell the client the command may have been
// applied); a retry executes again. SQLite does not abort the transaction:
// the 409 is committed and replayed.
func TestHandlerStatementFailureAbortsTx(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		e.exec(t, `CREATE TABLE uq (v TEXT PRIMARY KEY)`)
		e.exec(t, `INSERT INTO uq (v) VALUES ('taken')`)
		var calls atomic.Int64
		h := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := e.effect(r, "ab"); err != nil {
				t.Errorf("effect: %v", err)
			}
			if err := e.txExec(r, `INSERT INTO uq (v) VALUES ('taken')`); err == nil {
				t.Error("the duplicate INSERT succeeded")
			}
			w.WriteHeader(http.StatusConflict) // "already exists", stored
		}))
		for i := range 2 {
			rr := send(h, "POST", "/pay", "k", `{}`)
			if strings.HasPrefix(e.name, "sqlite") {
				if rr.Code != http.StatusConflict {
					t.Fatalf("attempt %d: %d, want the stored 409", i, rr.Code)
				}
				continue
			}
			checkProblem(t, rr, http.StatusInternalServerError, problem.TypeTransactionAborted)
		}
		want, effects := 2, 0
		if strings.HasPrefix(e.name, "sqlite") {
			want, effects = 1, 1 // replayed
		}
		if calls.Load() != int64(want) || e.effects(t, "ab") != effects {
			t.Fatalf("calls = %d, effects = %d; want %d and %d", calls.Load(), e.effects(t, "ab"), want, effects)
		}
	})
}

// TestHandlerEndsTx: a handler that commits idem's transaction itself (or
// rolls it back) never gets 503 outcome-unknown, which would have the
// client retry and apply a committed effect again and again: with pgx
// (pgdriver's TxClaimer) the Commit is refused and the outcome is stored
// with the effect; with *sql.Tx (and pgx's own transactions on the generic
// path) idem answers 500 transaction-ended. sqlitedriver's TxClaimer turns
// the handler's Commit into a rollback: nothing is committed, and the
// answer says so.
func TestHandlerEndsTx(t *testing.T) {
	for _, commit := range []bool{true, false} {
		name := "rollback"
		if commit {
			name = "commit"
		}
		t.Run(name, func(t *testing.T) {
			forEach(t, func(t *testing.T, e *env) {
				var calls atomic.Int64
				var refused atomic.Bool
				h := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls.Add(1)
					if err := e.effect(r, "end"); err != nil {
						t.Errorf("effect: %v", err)
					}
					refused.Store(e.endTx(r, commit) != nil)
					w.WriteHeader(201)
				}))
				rr := send(h, "POST", "/pay", "k", `{}`)
				switch e.name {
				case "postgres":
					if !refused.Load() {
						t.Fatal("pgdriver's TxClaimer let the handler end idem's transaction")
					}
					// The transaction stayed idem's: stored and replayed.
					if rr.Code != 201 {
						t.Fatalf("%d %s, want 201", rr.Code, rr.Body)
					}
					if rr2 := send(h, "POST", "/pay", "k", `{}`); rr2.Header().Get(idemhttp.ReplayedHeader) != "true" {
						t.Fatalf("retry: %d, not replayed", rr2.Code)
					}
					if calls.Load() != 1 || e.effects(t, "end") != 1 {
						t.Fatalf("calls = %d, effects = %d; want 1 and 1", calls.Load(), e.effects(t, "end"))
					}
					return
				case "sqlite":
					if commit && !refused.Load() {
						t.Fatal("sqlitedriver's TxClaimer let the handler commit idem's transaction")
					}
					// Ended, and nothing of it committed.
					if n := e.effects(t, "end"); n != 0 {
						t.Fatalf("%d effects committed; want none", n)
					}
					if !strings.Contains(rr.Body.String(), "nothing was committed") {
						t.Errorf("answer %s: want it to say that nothing was committed", rr.Body)
					}
				}
				checkProblem(t, rr, http.StatusInternalServerError, problem.TypeTransactionEnded)
			})
		})
	}
}

// TestRequestEndsBeforeCommit: the client goes away after the handler
// returned and before idem commits (the clock is read in between, and the
// test's clock cancels the request then). database/sql rolls a transaction
// back when the context it was begun with ends, so the commit finds it done:
// that is not the handler ending it, and idem must not answer 500
// transaction-ended nor 503 outcome-unknown (it answers 503
// store-unavailable, in case the client is still there); nothing is
// stored, and a retry executes once. pgx keeps its transaction and commits it.
func TestRequestEndsBeforeCommit(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		var (
			calls    atomic.Int64
			handled  atomic.Pointer[http.Request]
			outcomes = make(chan idemhttp.Outcome, 4)
		)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := &idemhttp.Config{
			OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outcomes <- o },
			Now: func() time.Time {
				if r := handled.Swap(nil); r != nil {
					cancel()
					// Wait for database/sql's rollback (pgx's transaction
					// stays open: the wait ends at its deadline).
					ctx := context.WithoutCancel(r.Context())
					for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
						if e.txExec(r.WithContext(ctx), `SELECT 1`) != nil {
							break
						}
					}
				}
				return time.Now()
			},
		}
		h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if err := e.effect(r, "gone"); err != nil {
				t.Errorf("effect: %v", err)
			}
			w.WriteHeader(http.StatusCreated)
			if calls.Load() == 1 {
				handled.Store(r)
			}
		}))
		req := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("Content-Type", "application/json")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		first := <-outcomes
		switch first {
		case idemhttp.OutcomeExecuted: // pgx: committed
			if e.effects(t, "gone") != 1 {
				t.Fatalf("executed, but %d effects", e.effects(t, "gone"))
			}
		case idemhttp.OutcomeNotStored:
			// Rolled back: 503 store-unavailable (in case the client is
			// still there), not transaction-ended or outcome-unknown.
			checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeStoreUnavailable)
			if rr.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
			if n := e.effects(t, "gone"); n != 0 {
				t.Fatalf("not stored, but %d effects committed", n)
			}
		default:
			t.Fatalf("outcome %v (%d %s), want executed or not_stored", first, rr.Code, rr.Body)
		}
		rr2 := send(h, "POST", "/pay", "k", `{}`)
		if rr2.Code != http.StatusCreated || e.effects(t, "gone") != 1 {
			t.Fatalf("retry: %d %s with %d effects; want 201 and 1", rr2.Code, rr2.Body, e.effects(t, "gone"))
		}
	})
}

// TestHandlerCommitsTxThenRetry: a handler that commits idem's transaction
// itself (a bug it has on its first execution only), then a retry of the
// same request. With a TxClaimer nothing of the first execution may be
// committed without its record: pgdriver refuses the handler's Commit (the
// outcome is stored with the effect, the retry replays), sqlitedriver turns
// it into a rollback (idem answers 500 transaction-ended saying nothing was
// committed, the retry executes). Either way one effect in the end, never
// two.
func TestHandlerCommitsTxThenRetry(t *testing.T) {
	for _, b := range []struct {
		name string
		mk   func(t *testing.T) *env
	}{{"postgres", pgEnv}, {"sqlite", sqliteEnv}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := b.mk(t)
			var (
				calls     atomic.Int64
				commitErr atomic.Pointer[error]
				logs      testlog.Buffer
				outcomes  = make(chan idemhttp.Outcome, 4)
			)
			cfg := &idemhttp.Config{
				Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
				OnOutcome: func(_ *http.Request, o idemhttp.Outcome) { outcomes <- o },
			}
			h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := e.effect(r, "self"); err != nil {
					t.Errorf("effect: %v", err)
				}
				if calls.Add(1) == 1 {
					err := e.endTx(r, true)
					commitErr.Store(&err)
				}
				w.WriteHeader(http.StatusCreated)
			}))

			first := send(h, "POST", "/pay", "k", `{}`)
			firstOutcome := <-outcomes
			if err := *commitErr.Load(); err == nil {
				t.Errorf("the handler's own Commit succeeded: it committed its effect without the record")
			} else {
				t.Logf("the handler's Commit: %v", err)
			}
			switch e.name {
			case "postgres":
				// Refused: the transaction stayed idem's.
				if first.Code != http.StatusCreated || firstOutcome != idemhttp.OutcomeExecuted {
					t.Fatalf("first: %d %s (%v), want 201 executed", first.Code, first.Body, firstOutcome)
				}
			default:
				checkProblem(t, first, http.StatusInternalServerError, problem.TypeTransactionEnded)
				if firstOutcome != idemhttp.OutcomeNotStored {
					t.Errorf("first outcome %v, want not_stored", firstOutcome)
				}
				if !strings.Contains(first.Body.String(), "nothing was committed") {
					t.Errorf("first answer %s: want it to say that nothing was committed", first.Body)
				}
				if l := logs.String(); !strings.Contains(l, "nothing was committed") || strings.Contains(l, "may have been") {
					t.Errorf("log %q: want it to say that nothing was committed", l)
				}
				if n := e.effects(t, "self"); n != 0 {
					t.Errorf("after the first answer: %d effects committed without a record; want 0", n)
				}
			}

			retry := send(h, "POST", "/pay", "k", `{}`)
			<-outcomes
			if retry.Code != http.StatusCreated {
				t.Fatalf("retry: %d %s, want 201", retry.Code, retry.Body)
			}
			if n := e.effects(t, "self"); n != 1 {
				t.Fatalf("%d effects after the retry (handler ran %d times); want exactly 1", n, calls.Load())
			}
			if rr := send(h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("third attempt: %d, not replayed", rr.Code)
			}
			<-outcomes
		})
	}
}

// TestHandlerEndsTxThenFails: a handler that commits idem's transaction
// itself (or rolls it back) and then answers a status that is not stored
// (500 "commit failed"), or a storable response too large to store. Passed
// on, that answer would have the client retry with the same key, and where
// the handler's COMMIT committed (pgsqldriver, the generic path) the retry
// would execute the command a second time. idem answers 500
// transaction-ended instead, as when the handler answers a stored status
// (idemclient does not retry it), and says that nothing was committed only
// where the driver guarantees it (sqlitedriver). pgdriver refuses the
// handler's Commit and Rollback: its answer goes out as it would have.
func TestHandlerEndsTxThenFails(t *testing.T) {
	answers := []struct {
		name  string
		max   int // Config.MaxResponseBytes
		write func(w http.ResponseWriter)
	}{
		{"500", 0, func(w http.ResponseWriter) { http.Error(w, "commit failed", http.StatusInternalServerError) }},
		{"too-large", 64, func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(strings.Repeat("x", 1024)))
		}},
	}
	for _, commit := range []bool{true, false} {
		end := "rollback"
		if commit {
			end = "commit"
		}
		for _, ans := range answers {
			t.Run(end+"-"+ans.name, func(t *testing.T) {
				forEach(t, func(t *testing.T, e *env) {
					var (
						calls    atomic.Int64
						refused  atomic.Bool
						logs     testlog.Buffer
						outcomes = make(chan idemhttp.Outcome, 4)
					)
					cfg := &idemhttp.Config{
						Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
						OnOutcome:        func(_ *http.Request, o idemhttp.Outcome) { outcomes <- o },
						MaxResponseBytes: ans.max,
					}
					h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if err := e.effect(r, "endfail"); err != nil {
							t.Errorf("effect: %v", err)
						}
						if calls.Add(1) == 1 { // the bug, on the first execution only
							refused.Store(e.endTx(r, commit) != nil)
							ans.write(w)
							return
						}
						w.WriteHeader(http.StatusCreated)
					}))

					first := send(h, "POST", "/pay", "k", `{}`)
					if o := <-outcomes; o != idemhttp.OutcomeNotStored {
						t.Errorf("first outcome %v, want not_stored", o)
					}
					committed := e.effects(t, "endfail")
					switch e.name {
					case "postgres":
						if !refused.Load() {
							t.Fatal("pgdriver's TxClaimer let the handler end idem's transaction")
						}
						// The transaction stayed idem's and was rolled back.
						if ans.max == 0 {
							if first.Code != http.StatusInternalServerError || !strings.Contains(first.Body.String(), "commit failed") {
								t.Fatalf("first: %d %s, want the handler's 500", first.Code, first.Body)
							}
						} else {
							checkProblem(t, first, http.StatusInternalServerError, problem.TypeResponseTooLarge)
						}
						if committed != 0 {
							t.Fatalf("%d effects committed; want none", committed)
						}
					default:
						checkProblem(t, first, http.StatusInternalServerError, problem.TypeTransactionEnded)
						if l := logs.String(); !strings.Contains(l, "level=ERROR") ||
							!strings.Contains(l, "committed or rolled back the middleware's transaction itself") {
							t.Errorf("log %q: want an ERROR about the handler ending the transaction", l)
						}
						want, says := 0, "may have been applied"
						switch {
						case e.name == "sqlite":
							says = "nothing was committed"
						case commit:
							want = 1 // database/sql's or pgx's COMMIT committed the effect
						}
						if !strings.Contains(first.Body.String(), says) {
							t.Errorf("first answer %s: want it to say %q", first.Body, says)
						}
						if committed != want {
							t.Fatalf("%d effects committed by the handler; want %d", committed, want)
						}
					}
					if committed != 0 {
						return // a retry would apply it again: the answer says so, and idemclient does not retry it
					}
					// Nothing was committed: a retry executes once.
					retry := send(h, "POST", "/pay", "k", `{}`)
					<-outcomes
					if retry.Code != http.StatusCreated || e.effects(t, "endfail") != 1 {
						t.Fatalf("retry: %d %s with %d effects; want 201 and 1", retry.Code, retry.Body, e.effects(t, "endfail"))
					}
				})
			})
		}
	}
}
