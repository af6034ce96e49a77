package idemhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/driver/pgdriver"
	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/problem"
)

// Crash tests run a real server in a child process (this test binary,
// re-executed) and kill it at a chosen point: os.Exit, as a crash or
// kill -9 would, with no deferred cleanup. The parent then retries against
// the same database and counts effects.

const (
	childEnv    = "IDEMHTTP_CRASH_CHILD"
	crashInside = "in-handler"   // after the business write, before commit
	crashAfter  = "after-commit" // after commit, before the response leaves
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	os.Exit(m.Run())
}

// runChild serves one idempotent endpoint and dies at the requested point.
func runChild() {
	backend, target := os.Getenv("CHILD_BACKEND"), os.Getenv("CHILD_TARGET")
	crash := os.Getenv("CHILD_CRASH")
	mode := idemhttp.ModeTx
	if os.Getenv("CHILD_MODE") == "lease" {
		mode = idemhttp.ModeLease
	}
	t := &testing.T{} // only for the env constructors' signatures; they call Fatal on setup errors
	var e *env
	switch backend {
	case "postgres":
		drv, err := pgdriver.New(mustPool(target), &pgdriver.Config{Schema: target})
		if err != nil {
			panic(err)
		}
		e = pgEnvOn(t, drv)
	default:
		drv, err := sqlitedriver.Open(target, nil)
		if err != nil {
			panic(err)
		}
		e = sqliteEnvOn(t, drv)
	}
	cfg := &idemhttp.Config{Mode: mode, Lease: time.Second, OnOutcome: func(_ *http.Request, o idemhttp.Outcome) {
		if crash == crashAfter && o == idemhttp.OutcomeExecuted {
			os.Exit(3)
		}
	}}
	h := e.wrap(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := e.effect(r, "crash"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if crash == crashInside {
			os.Exit(3)
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"from":"child"}`))
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Printf("ADDR %s\n", ln.Addr())
	_ = http.Serve(ln, h)
}

// mustPool opens the child's pool on the parent's schema.
func mustPool(schema string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testdb.DSN())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	return pool
}

// startChild runs the child and returns its address and a wait function
// returning its exit code.
func startChild(t *testing.T, backend, target, mode, crash string) (string, func() int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_BACKEND="+backend, "CHILD_TARGET="+target,
		"CHILD_MODE="+mode, "CHILD_CRASH="+crash)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			return addr, func() int {
				_ = cmd.Wait()
				return cmd.ProcessState.ExitCode()
			}
		}
	}
	t.Fatalf("child printed no address: %v", sc.Err())
	return "", nil
}

func TestCrashSafety(t *testing.T) {
	t.Parallel()
	type result struct {
		effectsAfterCrash int
		retryReplayed     bool
	}
	cases := []struct {
		mode, crash string
		want        result
	}{
		// Transaction-bound: a crash before commit leaves nothing; the retry
		// executes once. A crash after commit leaves both; the retry replays.
		{"tx", crashInside, result{0, false}},
		{"tx", crashAfter, result{1, true}},
		// Lease mode after the response was stored: replayed.
		{"lease", crashAfter, result{1, true}},
	}
	for _, b := range []string{"postgres", "sqlite"} {
		for _, c := range cases {
			t.Run(b+"/"+c.mode+"/"+c.crash, func(t *testing.T) {
				t.Parallel()
				e, target := crashEnv(t, b)
				addr, wait := startChild(t, b, target, c.mode, c.crash)
				_, err := postKey("http://"+addr, "crash-key")
				if err == nil {
					t.Fatal("the client got an answer from a process that crashed")
				}
				if code := wait(); code != 3 {
					t.Fatalf("child exit code %d, want 3", code)
				}
				if n := e.effects(t, "crash"); n != c.want.effectsAfterCrash {
					t.Fatalf("effects after crash = %d, want %d", n, c.want.effectsAfterCrash)
				}
				// The client retries with the same key against a healthy server.
				var calls atomic.Int64
				mode := idemhttp.ModeTx
				if c.mode == "lease" {
					mode = idemhttp.ModeLease
				}
				h := e.wrap(t, &idemhttp.Config{Mode: mode}, effectHandler(t, e, 201, &calls))
				srv := newServer(t, h)
				res, err := postKey(srv, "crash-key")
				if err != nil {
					t.Fatal(err)
				}
				if res.StatusCode != 201 || (res.Header.Get(idemhttp.ReplayedHeader) == "true") != c.want.retryReplayed {
					t.Fatalf("retry: %d replayed=%q, want replayed=%v", res.StatusCode, res.Header.Get(idemhttp.ReplayedHeader), c.want.retryReplayed)
				}
				if n := e.effects(t, "crash") + e.effects(t, "x"); n != 1 {
					t.Fatalf("effects after retry = %d, want exactly 1", n)
				}
				again, _ := postKey(srv, "crash-key")
				if again.Header.Get(idemhttp.ReplayedHeader) != "true" {
					t.Fatal("second retry not replayed")
				}
			})
		}
	}
}

// TestLeaseTakeoverAfterOwnerDies: a lease-mode owner dies in the handler.
// Until its lease expires the key stays taken (409); afterwards a retry
// takes over and executes. The dead owner's external effect stays: that is
// the documented limit of lease mode.
func TestLeaseTakeoverAfterOwnerDies(t *testing.T) {
	t.Parallel()
	for _, b := range []string{"postgres", "sqlite"} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			e, target := crashEnv(t, b)
			addr, wait := startChild(t, b, target, "lease", crashInside)
			sent := time.Now() // the lease starts after this, at the claim
			if _, err := postKey("http://"+addr, "crash-key"); err == nil {
				t.Fatal("answer from a crashed process")
			}
			wait()
			var calls atomic.Int64
			h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: time.Second, Wait: idemhttp.NoWait},
				effectHandler(t, e, 201, &calls))
			srv := newServer(t, h)
			res, err := postKey(srv, "crash-key")
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(sent) < 900*time.Millisecond && res.StatusCode != 409 {
				t.Fatalf("key taken over while the lease was live: %d", res.StatusCode)
			}
			deadline := time.Now().Add(30 * time.Second) // generous for a loaded machine
			for res.StatusCode == 409 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				res, _ = postKey(srv, "crash-key")
			}
			if res.StatusCode != 201 || calls.Load() != 1 {
				t.Fatalf("after the lease expired: %d, calls %d; want a takeover", res.StatusCode, calls.Load())
			}
			if took := time.Since(sent); took < time.Second {
				t.Fatalf("takeover after %s, before the 1s lease expired", took)
			}
		})
	}
}

// TestNoTakeoverWhileOwnerAlive: the owner's heartbeat keeps its lease alive
// far beyond the lease duration; duplicates never execute.
//
// The lease is 1 s, renewed every Lease/3 with each renewal bounded by
// Lease/3: on a loaded machine the owner can lose it for real, when the
// process stalls past the lease or the store answers no renewal in time
// (seen on SQLite and pgsqldriver: the owner's context was cancelled and
// it answered 500). An attempt where that could have happened (the meter
// saw the process stall for more than Lease/3, or the log says a renewal
// failed, the lease expired after failed renewals, or a store call ran out
// of its time) and that failed proves nothing either way: it runs again on
// a new key. An attempt
// without must pass every check, and three disturbed attempts in a row
// fail the test: a heartbeat that does not renew fails every attempt.
func TestNoTakeoverWhileOwnerAlive(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, e *env) {
		const attempts = 3
		for n := 1; ; n++ {
			failed, disturbed := noTakeoverWhileOwnerAlive(t, e, n)
			if failed == "" {
				return
			}
			if disturbed == "" || n == attempts {
				t.Fatalf("attempt %d: %s (disturbed: %q)", n, failed, disturbed)
			}
			t.Logf("attempt %d failed (%s) while the owner could lose its lease for real (%s): again", n, failed, disturbed)
		}
	})
}

// noTakeoverWhileOwnerAlive runs one attempt of TestNoTakeoverWhileOwnerAlive
// on a key and an effect label of its own. It returns what failed ("" if
// nothing) and what could have made the owner lose its lease ("" if
// nothing).
func noTakeoverWhileOwnerAlive(t *testing.T, e *env, attempt int) (failed, disturbed string) {
	t.Helper()
	key, target := fmt.Sprintf("one-key-%d", attempt), fmt.Sprintf("/pay?label=c%d", attempt)
	label := fmt.Sprintf("c%d", attempt)
	var calls, entered atomic.Int64
	// The owner (the first execution) runs until every duplicate has
	// been answered, so that each is sent while it is alive however
	// late a loaded machine sends it; a duplicate that executed would
	// not wait.
	running, release := make(chan struct{}), make(chan struct{})
	releaseOwner := sync.OnceFunc(func() { close(release) })
	defer releaseOwner()
	var logs syncBuffer
	h := e.wrap(t, &idemhttp.Config{Mode: idemhttp.ModeLease, Lease: time.Second, Wait: idemhttp.NoWait,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if entered.Add(1) == 1 {
				close(running)
				<-release
			}
			calls.Add(1)
			// Not effectHandler: its t.Errorf would fail a disturbed
			// attempt (an owner whose lease was lost has its context
			// cancelled).
			if err := e.effect(r, label); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
	meter := stallmeter.Start(t)
	defer func() {
		if stalled := meter.Stop(); stalled > time.Second/3 {
			disturbed = fmt.Sprintf("the process stalled %s", stalled.Round(time.Millisecond))
		}
		for _, l := range strings.Split(logs.String(), "\n") {
			// A renewal that failed, or a store call bounded by Lease/3
			// (the claim's fresh lease, a renewal) that ran out.
			if strings.Contains(l, "lease renewal failed") || strings.Contains(l, "lease expired (renewals failed)") ||
				strings.Contains(l, context.DeadlineExceeded.Error()) {
				disturbed = strings.TrimPrefix(disturbed+"; ", "; ") + l
				break
			}
		}
	}()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- send(h, "POST", target, key, `{"amount":"1.00"}`) }()
	select {
	case <-running:
	case rr := <-done:
		return fmt.Sprintf("the first request was answered %d %s without reaching the handler", rr.Code, rr.Body), ""
	case <-time.After(60 * time.Second):
		t.Fatal("the first request did not reach the handler within 60 s")
	}
	start := time.Now()
	var fails []string
	// Duplicates at 0.5s, 1.5s and 2.2s: the last two come after the
	// first lease (1s) would have expired without renewal.
	for _, at := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 2200 * time.Millisecond} {
		time.Sleep(time.Until(start.Add(at)))
		rr := send(h, "POST", target, key, `{"amount":"1.00"}`)
		if rr.Code != http.StatusConflict || rr.Result().Header.Get("Content-Type") != problem.MediaType ||
			!strings.Contains(rr.Body.String(), problem.TypeRequestInProgress) {
			fails = append(fails, fmt.Sprintf("duplicate at %s: %d %s, want 409 request-in-progress", at, rr.Code, rr.Body))
		}
	}
	releaseOwner()
	if rr := <-done; rr.Code != http.StatusCreated {
		fails = append(fails, fmt.Sprintf("owner answered %d %s", rr.Code, rr.Body))
	}
	if rr := send(h, "POST", target, key, `{"amount":"1.00"}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
		fails = append(fails, fmt.Sprintf("no replay after the owner finished: %d %s", rr.Code, rr.Body))
	}
	if c, n := calls.Load(), e.effects(t, label); c != 1 || n != 1 {
		fails = append(fails, fmt.Sprintf("calls = %d, effects = %d, want 1", c, n))
	}
	return strings.Join(fails, "; "), ""
}

// TestConnectionKilledBeforeCommit: the database connection dies between the
// business write and the commit. Nothing is applied; the retry executes once.
// On PostgreSQL over pgx and over database/sql (pgsqldriver).
func TestConnectionKilledBeforeCommit(t *testing.T) {
	t.Parallel()
	for _, b := range backendList {
		if b.name == "postgres" || b.name == "postgres-generic" || b.name == "postgres-sql" {
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				connectionKilledBeforeCommit(t, b.mk(t))
			})
		}
	}
}

func connectionKilledBeforeCommit(t *testing.T, e *env) {
	var calls atomic.Int64
	kill := true
	h := e.wrap(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if err := e.effect(r, "killed"); err != nil {
			t.Error(err)
		}
		if kill {
			if err := e.kill(r); err != nil {
				t.Error(err)
			}
		}
		w.WriteHeader(201)
	}))
	rr := send(h, "POST", "/pay", "k", `{}`)
	if rr.Code != 503 {
		t.Fatalf("status %d, want 503", rr.Code)
	}
	if n := e.effects(t, "killed"); n != 0 {
		t.Fatalf("effects = %d after a killed connection, want 0", n)
	}
	kill = false
	if rr := send(h, "POST", "/pay", "k", `{}`); rr.Code != 201 || rr.Header().Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("retry: %d", rr.Code)
	}
	if rr := send(h, "POST", "/pay", "k", `{}`); rr.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatal("no replay")
	}
	if n := e.effects(t, "killed"); n != 1 || calls.Load() != 2 {
		t.Fatalf("effects = %d, calls = %d", n, calls.Load())
	}
}

// crashEnv makes a fresh database for a crash test and returns the parent's
// env and the target the child opens (PostgreSQL schema or SQLite path).
func crashEnv(t *testing.T, backend string) (*env, string) {
	if backend == "postgres" {
		drv := testdb.Postgres(t)
		return pgEnvOn(t, drv), schemaOf(t, drv)
	}
	path := testdb.SQLitePath(t)
	drv, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	if err := drv.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sqliteEnvOn(t, drv), path
}

func newServer(t *testing.T, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func postKey(base, key string) (*http.Response, error) {
	req, err := http.NewRequest("POST", base+"/pay", strings.NewReader(`{"amount":"1.00"}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode >= 500 {
		return res, errors.New(res.Status)
	}
	return res, nil
}
