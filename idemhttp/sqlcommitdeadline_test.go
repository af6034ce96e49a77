package idemhttp_test

import (
	"bytes"
	"database/sql"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// TestCommitDeadline over pgsqldriver: database/sql sends a *sql.Tx's
// COMMIT on the context the transaction began with (the request's, which
// a waiting client never cancels), not on the one of Driver.Commit or
// CommitComplete, so Config.CommitTimeout did not bound it: a COMMIT that
// PostgreSQL did not answer held the request, its connection and the key
// until the OS gave up on the socket. It is bounded as with pgdriver: 503
// outcome-unknown within CommitTimeout, the connection given up, and a
// retry replays what was committed or executes once.
func TestSQLCommitDeadline(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"txclaim", "generic"} {
		for _, fault := range []testdb.Fault{testdb.BlackHole, testdb.BlackHoleReply} {
			name := path + "/commit-lost"
			if fault == testdb.BlackHoleReply {
				name = path + "/answer-lost"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				direct, proxied, proxy := proxiedPostgresSQL(t)
				proxy.EndOnTerminate() // pgx's 15 s drain of the given-up connection is not what is tested
				e := sqlEnvWith(t, direct, direct.DB(), false)
				marker := randomMarker("scdl-")
				var calls atomic.Int64
				handler := markedEffect(e, marker, &calls)
				var logs syncBuffer
				mw, err := idemhttp.New(withoutTxClaimer[*sql.Tx](proxied, path == "generic"), &idemhttp.Config{
					Scope: fixedScope, CommitTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				// Both paths send the COMMIT as a statement of its own.
				f := proxy.Arm(fault, isSimpleCommit)

				rr, took := sendTimed(t, mw.Handler(handler), "/pay", "k", 10*time.Second, f)
				select {
				case <-f.Fired():
				default:
					t.Fatalf("the fault did not fire; answer %d %s", rr.Code, rr.Body)
				}
				checkProblem(t, rr, http.StatusServiceUnavailable, problem.TypeOutcomeUnknown)
				if took > 5*time.Second {
					t.Errorf("answered %s after the faulted call (the process's stalls left out) with a CommitTimeout of 1s", took)
				}
				if !strings.Contains(logs.String(), "commit result unknown") || !strings.Contains(logs.String(), "CommitTimeout") {
					t.Errorf("log does not say the COMMIT's outcome is unknown after CommitTimeout:\n%s", logs.String())
				}
				// The connection was given up and closed. (The pgx stdlib
				// driver has no driver.Validator: database/sql keeps the
				// closed connection idle, and discards it at its next use,
				// which goes to a new connection. pgx closes it after a
				// cancel request, a Terminate and up to 15 s of draining,
				// cut short by the proxy on the Terminate, as in
				// TestCommitDeadline.)
				select {
				case <-f.ClientClosed():
				case <-time.After(40 * time.Second):
					t.Fatal("the connection of the COMMIT that did not answer was not closed")
				}
				if st := proxied.DB().Stats(); st.InUse != 0 {
					t.Fatalf("%d connections in use after the request was answered: %+v", st.InUse, st)
				}
				if err := proxied.DB().QueryRowContext(t.Context(), `SELECT 1`).Scan(new(int)); err != nil {
					t.Fatalf("the pool after the faulted connection: %v", err)
				}

				retry := func(wait time.Duration) *httptest.ResponseRecorder {
					mw, err := idemhttp.New(withoutTxClaimer[*sql.Tx](direct, path == "generic"), &idemhttp.Config{Scope: fixedScope, Wait: wait})
					if err != nil {
						t.Fatal(err)
					}
					return send(mw.Handler(handler), "POST", "/pay", "k", `{}`)
				}
				checkRetriesAfterLostCommit(t, fault, f, &calls, marker, retry)
				if n := e.effects(t, "cdl"); n != 1 {
					t.Fatalf("effects = %d, want exactly 1", n)
				}
			})
		}
	}
}

// isSimpleRollback matches a simple-protocol ROLLBACK (a *sql.Tx's).
func isSimpleRollback(b []byte) bool {
	return len(b) > 6 && b[0] == 'Q' && bytes.EqualFold(bytes.TrimRight(b[5:], "\x00"), []byte("rollback"))
}

// A replay over pgsqldriver reads the record in BeginClaim's transaction
// and rolls it back before answering. That ROLLBACK went out on the
// request's context too: one PostgreSQL did not answer held the replay
// for ever. It is bounded (idemhttp gives a rollback 5 s): the replay is
// answered, and the connection given up.
func TestSQLReplayRollbackDeadline(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedPostgresSQL(t)
	var calls atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	first, err := idemhttp.New[*sql.Tx](direct, &idemhttp.Config{Scope: fixedScope})
	if err != nil {
		t.Fatal(err)
	}
	if rr := send(first.Handler(handler), "POST", "/pay", "k", `{}`); rr.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", rr.Code, rr.Body)
	}
	mw, err := idemhttp.New[*sql.Tx](proxied, &idemhttp.Config{Scope: fixedScope, ReplayCacheBytes: idemhttp.NoReplayCache})
	if err != nil {
		t.Fatal(err)
	}
	f := proxy.Arm(testdb.BlackHole, isSimpleRollback)
	rr, took := sendTimed(t, mw.Handler(handler), "/pay", "k", 15*time.Second, f)
	select {
	case <-f.Fired():
	default:
		t.Fatalf("the fault did not fire; answer %d %s", rr.Code, rr.Body)
	}
	if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %q %s", rr.Code, rr.Header().Get(idemhttp.ReplayedHeader), rr.Body)
	}
	if took > 10*time.Second {
		t.Errorf("replay answered %s after its ROLLBACK went out (the process's stalls left out)", took)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	if st := proxied.DB().Stats(); st.InUse != 0 {
		t.Fatalf("%d connections in use after the replay: %+v", st.InUse, st)
	}
}
