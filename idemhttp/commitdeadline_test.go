package idemhttp_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/pgsqldriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

func fixedScope(*http.Request) (string, error) { return "p", nil }

// randomMarker is a string that only the bytes of one test carry.
func randomMarker(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// isSimpleCommit matches a simple-protocol COMMIT (pgx.Tx's Commit).
func isSimpleCommit(b []byte) bool {
	return len(b) > 6 && b[0] == 'Q' && bytes.EqualFold(bytes.TrimRight(b[5:], "\x00"), []byte("commit"))
}

// sendTimed sends one request in the background and returns its answer,
// and the time from f firing (the store call that PostgreSQL does not
// answer went out) to the answer, less what the process stalled meanwhile
// (internal/stallmeter): the bound under test (CommitTimeout, a rollback's
// 5 s) starts there. What comes before is the loaded machine's: the
// request's connection through the proxy waits for one of the machine's
// PostgreSQL connection slots (internal/testdb) while other test
// processes hold them all, then the claim and the handler run. Counted
// from the send, that failed TestSQLCommitDeadline under load (answered
// 10.9 s after the send, CommitTimeout 1 s). When the answer takes longer
// than limit (plus the stalls) after f fired, sendTimed cuts the faulted
// connection (which ends the hang) and fails the test; when the request
// neither makes the faulted call nor is answered within a minute, it
// fails too. If f did not fire, the time counts from the send (the caller
// fails on f).
func sendTimed(t *testing.T, h http.Handler, target, key string, limit time.Duration, f *testdb.Faulted) (*httptest.ResponseRecorder, time.Duration) {
	t.Helper()
	meter := stallmeter.Start(t)
	start := time.Now()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- send(h, "POST", target, key, `{}`) }()
	took := func(from time.Time, stalledBefore time.Duration) time.Duration {
		end := time.Now()
		time.Sleep(3 * stallmeter.Tick) // a stall that ended just now is counted
		return max(end.Sub(from)-(meter.Stop()-stalledBefore), 0)
	}
	var fired time.Time
	var stalledBefore time.Duration
	select {
	case rr := <-done:
		return rr, took(start, 0)
	case <-f.Fired():
		fired, stalledBefore = time.Now(), meter.Stalled()
	case <-time.After(time.Minute):
		t.Fatalf("the request was not answered, nor did it make the store call of the fault, within a minute")
	}
	for {
		left := time.Until(fired.Add(limit + meter.Stalled() - stalledBefore))
		if left <= 0 {
			f.Cut()
			rr := <-done
			t.Fatalf("no answer within %s of a store call that PostgreSQL does not answer (made %s after the request was sent); %d %s once the connection was cut, %s after the call",
				limit, fired.Sub(start).Round(time.Millisecond), rr.Code, rr.Body, time.Since(fired).Round(time.Millisecond))
			return nil, 0
		}
		select {
		case rr := <-done:
			return rr, took(fired, stalledBefore)
		case <-time.After(left):
		}
	}
}

// The COMMIT of ModeTx ran on context.WithoutCancel(request): when
// PostgreSQL stopped answering (a partition that closes nothing, a hung
// server), the request hung until the OS gave up on the socket, holding a
// connection and the key. Config.CommitTimeout bounds it: the request is
// answered 503 outcome-unknown within it, the connection is given up, and
// a retry with the same key through a working pool replays what was
// committed or executes once. The proxy black-holes the connection right
// when the COMMIT goes out: before PostgreSQL gets it (nothing committed;
// its session holds the key's lock until it sees the connection gone), or
// after (committed, the answer lost).
func TestCommitDeadline(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"txclaim", "generic"} {
		for _, fault := range []testdb.Fault{testdb.BlackHole, testdb.BlackHoleReply} {
			name := path + "/commit-lost"
			if fault == testdb.BlackHoleReply {
				name = path + "/answer-lost"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				direct, proxied, proxy := proxiedPostgres(t)
				proxy.EndOnTerminate() // pgx's 15 s drain of the given-up connection is not what is tested
				e := pgEnvOn(t, direct)
				marker := randomMarker("cdl-")
				var calls atomic.Int64
				handler := markedEffect(e, marker, &calls)
				var logs syncBuffer
				mw, err := idemhttp.New(withoutTxClaimer[pgx.Tx](proxied, path == "generic"), &idemhttp.Config{
					Scope: fixedScope, CommitTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				// The completed record goes with the COMMIT (txclaim); the
				// generic path's COMMIT is a statement of its own.
				match := func(b []byte) bool { return bytes.Contains(b, []byte(marker)) }
				if path == "generic" {
					match = isSimpleCommit
				}
				f := proxy.Arm(fault, match)

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
				if rr.Header().Get("Retry-After") == "" {
					t.Error("no Retry-After")
				}
				if !strings.Contains(logs.String(), "commit result unknown") || !strings.Contains(logs.String(), "CommitTimeout") {
					t.Errorf("log does not say the COMMIT's outcome is unknown after CommitTimeout:\n%s", logs.String())
				}
				// Nothing held on this side: the connection was given up,
				// not put back in the pool, and closed (pgx sends a cancel
				// request on a new connection, then a Terminate on this
				// one, and drains it in the background until the server
				// closes it, or 15 s have passed, the pool counting it
				// until then: the proxy closes it on the Terminate, which
				// only a client giving it up sends).
				select {
				case <-f.ClientClosed():
				case <-time.After(40 * time.Second):
					t.Fatal("the connection of the COMMIT that did not answer was not closed")
				}
				for deadline := time.Now().Add(5 * time.Second); proxied.Pool().Stat().TotalConns() != 0; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%d connections still in the pool (%d acquired) after the COMMIT's was closed",
							proxied.Pool().Stat().TotalConns(), proxied.Pool().Stat().AcquiredConns())
					}
				}

				// The retries, through a working pool.
				retry := func(wait time.Duration) *httptest.ResponseRecorder {
					mw, err := idemhttp.New(withoutTxClaimer[pgx.Tx](direct, path == "generic"), &idemhttp.Config{Scope: fixedScope, Wait: wait})
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

// In ModeLease each attempt to store the outcome was bounded by Lease/3
// alone (100 s with a 5 min lease): CommitTimeout bounds it too. The first
// attempt's connection is black-holed; the next attempt, on another
// connection, stores the outcome within a few seconds, and the retry
// replays it.
func TestLeaseCompleteDeadline(t *testing.T) {
	t.Parallel()
	for _, fault := range []testdb.Fault{testdb.BlackHole, testdb.BlackHoleReply} {
		name := "store-lost"
		if fault == testdb.BlackHoleReply {
			name = "answer-lost"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			direct, proxied, proxy := proxiedPostgres(t)
			proxy.EndOnTerminate() // pgx's 15 s drain of the given-up connection is not what is tested
			marker := randomMarker("lcd-")
			var calls atomic.Int64
			handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"marker":%q}`, marker)
			})
			mw, err := idemhttp.New[pgx.Tx](proxied, &idemhttp.Config{Mode: idemhttp.ModeLease, Scope: fixedScope,
				Lease: 5 * time.Minute, CommitTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			f := proxy.Arm(fault, func(b []byte) bool { return bytes.Contains(b, []byte(marker)) })
			rr, took := sendTimed(t, mw.Handler(handler), "/charge", "k", 20*time.Second, f)
			if rr.Code != http.StatusCreated {
				t.Fatalf("answer: %d %s", rr.Code, rr.Body)
			}
			if took > 5*time.Second {
				t.Errorf("answered %s after the faulted call (the process's stalls left out) with a CommitTimeout of 1s", took)
			}
			select {
			case <-f.Fired():
			default:
				t.Fatal("the fault did not fire")
			}
			other, err := idemhttp.New[pgx.Tx](direct, &idemhttp.Config{Mode: idemhttp.ModeLease, Scope: fixedScope})
			if err != nil {
				t.Fatal(err)
			}
			again := send(other.Handler(handler), "POST", "/charge", "k", `{}`)
			if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("retry: %d %q %s; want the replay", again.Code, again.Header().Get(idemhttp.ReplayedHeader), again.Body)
			}
			if calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", calls.Load())
			}
		})
	}
}

// checkRetriesAfterLostCommit checks the retries of a request whose COMMIT
// was black-holed (fault): with nothing committed, and PostgreSQL's session
// still holding the key, a retry is told to come back and never executed
// beside it, until PostgreSQL sees the connection gone (f.Cut) and rolls it
// back: then the retry executes. With the COMMIT's answer lost, the retry
// replays what was committed.
func checkRetriesAfterLostCommit(t *testing.T, fault testdb.Fault, f *testdb.Faulted, calls *atomic.Int64, marker string, retry func(wait time.Duration) *httptest.ResponseRecorder) {
	t.Helper()
	if fault == testdb.BlackHole {
		checkProblem(t, retry(500*time.Millisecond), http.StatusConflict, problem.TypeRequestInProgress)
		if calls.Load() != 1 {
			t.Fatalf("handler ran %d times while the first transaction was undecided", calls.Load())
		}
		f.Cut()
		again := retry(10 * time.Second)
		if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) != "" {
			t.Fatalf("retry once the session ended: %d %s; want the command executed", again.Code, again.Body)
		}
		return
	}
	again := retry(5 * time.Second)
	if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) != "true" ||
		!strings.Contains(again.Body.String(), marker) {
		t.Fatalf("retry of a committed command whose answer was lost: %d %q %s; want its replay",
			again.Code, again.Header().Get(idemhttp.ReplayedHeader), again.Body)
	}
}

// proxiedPostgres returns a migrated pgdriver on a fresh schema, another on
// the same schema whose pool (4 connections) goes through a fault proxy,
// and the proxy.
func proxiedPostgres(t *testing.T) (direct, proxied *pgdriver.Driver, proxy *testdb.Proxy) {
	t.Helper()
	direct = testdb.Postgres(t)
	schema := schemaOf(t, direct)
	proxy = testdb.NewProxy(t)
	proxied, err := pgdriver.New(proxy.Pool(t, schema, 4), &pgdriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return direct, proxied, proxy
}

// proxiedPostgresSQL is proxiedPostgres for pgsqldriver.
func proxiedPostgresSQL(t *testing.T) (direct, proxied *pgsqldriver.Driver, proxy *testdb.Proxy) {
	t.Helper()
	direct, schema := testdb.PostgresSQLSchema(t)
	proxy = testdb.NewProxy(t)
	db := stdlib.OpenDB(*proxy.ConnConfig(t, schema))
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = db.Close() })
	proxied, err := pgsqldriver.New(db, &pgsqldriver.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return direct, proxied, proxy
}

// markedEffect writes e's effect "cdl" and answers 201 with marker in its
// body (for a fault proxy to find), counting its calls.
func markedEffect(e *env, marker string, calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if err := e.effect(r, "cdl"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"marker":%q}`, marker)
	})
}

// pgdriver pipelines the completed record's write, the COMMIT and the
// release of the key's session-level lock in one round trip. When the
// connection was lost after the server had answered the COMMIT, before the
// unlock's answer (a server shutting down ends the session between the
// two, or the connection breaks after the COMMIT's answer), the request was
// answered 503 outcome-unknown although the COMMIT's answer said the
// command was committed: now it is answered with the handler's response,
// the connection (which may still hold the lock) is closed, and a retry
// replays. Both ways of completing: a new record, and an expired record
// replaced (its UPDATE, then the COMMIT with the unlock).
func TestConnectionLostAfterCommitAnswered(t *testing.T) {
	t.Parallel()
	for _, expired := range []bool{false, true} {
		name := "new"
		if expired {
			name = "expired"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			connectionLostAfterCommitAnswered(t, expired)
		})
	}
}

func connectionLostAfterCommitAnswered(t *testing.T, expired bool) {
	direct, proxied, proxy := proxiedPostgres(t)
	e := pgEnvOn(t, direct)
	marker := randomMarker("lac-")
	var calls atomic.Int64
	handler := markedEffect(e, marker, &calls)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	want := int64(1)
	if expired {
		// A first execution whose record has expired by the time of the
		// faulted one.
		first, err := idemhttp.New(direct, &idemhttp.Config{Scope: fixedScope, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		if rr := send(first.Handler(handler), "POST", "/pay", "k", `{}`); rr.Code != http.StatusCreated {
			t.Fatalf("first execution: %d %s", rr.Code, rr.Body)
		}
		now.Add(int64(25 * time.Hour))
		want = 2
	}
	var logs syncBuffer
	mw, err := idemhttp.New(proxied, &idemhttp.Config{Scope: fixedScope, Now: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The new record goes with the COMMIT; an expired one's UPDATE is a
	// statement of its own, the COMMIT goes with the unlock.
	match := func(b []byte) bool { return bytes.Contains(b, []byte(marker)) }
	if expired {
		match = func(b []byte) bool { return bytes.Contains(b, []byte("COMMIT; SELECT pg_advisory_unlock")) }
	}
	f := proxy.Arm(testdb.CutAfterCommit, match)
	rr, _ := sendTimed(t, mw.Handler(handler), "/pay", "k", 10*time.Second, f)
	select {
	case <-f.Fired():
	default:
		t.Fatalf("the fault did not fire; answer %d %s", rr.Code, rr.Body)
	}
	if rr.Code != http.StatusCreated || !strings.Contains(rr.Body.String(), marker) {
		t.Fatalf("answer: %d %s; want the handler's 201: the COMMIT was answered", rr.Code, rr.Body)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a committed command logged an error:\n%s", logs.String())
	}
	for deadline := time.Now().Add(5 * time.Second); proxied.Pool().Stat().TotalConns() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still in the pool after the lost one", proxied.Pool().Stat().TotalConns())
		}
	}
	again := send(mw.Handler(handler), "POST", "/pay", "k", `{}`)
	if again.Code != http.StatusCreated || again.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %q %s; want the replay", again.Code, again.Header().Get(idemhttp.ReplayedHeader), again.Body)
	}
	if calls.Load() != want {
		t.Fatalf("handler ran %d times, want %d", calls.Load(), want)
	}
	if n := e.effects(t, "cdl"); n != int(want) {
		t.Fatalf("effects = %d, want exactly %d", n, want)
	}
}
