package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/driver"
	"github.com/idemkit/idem/internal/dbclock"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
)

// A new broker log is marked as its database's only once the outbox was
// republished into it: a republication cut short (a stop, a crash, a
// database error) leaves the log unmarked, so the next start takes it for
// new again and republishes everything, instead of trusting a log that
// holds only part of the outbox.
func TestAdoptMarksOnlyAfterRedrive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := dbIdentity{Where: "sqlite:/x/idemd.db", Instance: "0190-test"}
	fresh, err := checkMarker(dir, id)
	if err != nil || !fresh {
		t.Fatalf("checkMarker on an empty dir: fresh=%v, %v", fresh, err)
	}
	a := &App{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := &embeddedBroker{dir: dir, fresh: true, identity: id}

	cut := errors.New("context canceled halfway")
	if err := b.adopt(context.Background(), a, func(context.Context) (int, error) { return 500, cut }); !errors.Is(err, cut) {
		t.Fatalf("adopt = %v, want the redrive's error", err)
	}
	if _, err := os.Stat(filepath.Join(dir, embeddedMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("marker after an interrupted redrive: %v; want none", err)
	}
	if fresh, err := checkMarker(dir, id); err != nil || !fresh {
		t.Fatalf("next start: fresh=%v, %v; want the log taken for new again", fresh, err)
	}

	calls := 0
	redrive := func(context.Context) (int, error) { calls++; return 1000, nil }
	if err := b.adopt(context.Background(), a, redrive); err != nil {
		t.Fatal(err)
	}
	if fresh, err := checkMarker(dir, id); err != nil || fresh {
		t.Fatalf("after a whole redrive: fresh=%v, %v; want the log marked", fresh, err)
	}
	if err := b.adopt(context.Background(), a, redrive); err != nil || calls != 1 {
		t.Errorf("adopt again: %v, %d redrives; want none (adopted)", err, calls)
	}
}

// A lease holder is taken for a process of this host only when it shares
// the host name and the PID namespace: two containers with one host name,
// both PID 1, must not take each other's lease for a dead process's.
func TestHolderOnThisHost(t *testing.T) {
	t.Parallel()
	ns := pidNamespace()
	if ns == "" {
		t.Fatal("no PID namespace on this Linux machine")
	}
	host, _ := os.Hostname()
	me := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		owner       string
		local, dead bool
	}{
		{host + "/" + me + "/cafe0001/" + ns, true, true},      // our PID, our namespace: a previous run
		{host + "/" + me + "/cafe0001/pid_[1]", false, false},  // our PID in another container
		{host + "/" + me + "/cafe0001", false, false},          // no namespace recorded
		{"other-host/" + me + "/cafe0001/" + ns, false, false}, // another host
		{host + "/1/cafe0001/" + ns, true, false},              // init of this namespace runs
		{host + "/999999999/cafe0001/" + ns, true, true},       // no such process here
	} {
		local, dead := holderOnThisHost(tc.owner, host)
		if local != tc.local || dead != tc.dead {
			t.Errorf("holderOnThisHost(%q) = local %v, dead %v; want %v, %v", tc.owner, local, dead, tc.local, tc.dead)
		}
	}
}

// A killed idemd whose parent has not reaped it yet (a zombie: a shell
// script, or a container's PID 1 that never calls wait) is gone: its
// lease is taken over at once, not refused as held by a running idemd.
func TestHolderOnThisHostZombieIsDead(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	pid := cmd.Process.Pid
	stat := "/proc/" + strconv.Itoa(pid) + "/stat"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i:]), ") Z") {
			break // exited, not reaped: a zombie
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not become a zombie: %s", pid, b)
		}
	}
	host, _ := os.Hostname()
	owner := host + "/" + strconv.Itoa(pid) + "/cafe0001/" + pidNamespace()
	if local, dead := holderOnThisHost(owner, host); !local || !dead {
		t.Errorf("holderOnThisHost(zombie %d) = local %v, dead %v; want local and dead", pid, local, dead)
	}
}

// An idemd whose embedded-broker lease was taken by another one (it could
// not renew it in time) stops: two embedded brokers would split the events
// of one database between two disjoint logs.
func TestLeaseTakenIsFatal(t *testing.T) {
	t.Parallel()
	drv := testdb.SQLite(t)
	a := &App{log: slog.New(slog.NewTextHandler(io.Discard, nil)), fatal: make(chan error, 1)}
	ctx := context.Background()
	ls, err := acquireLease(ctx, a, drv.Executor(), dbclock.New(drv, a.log, "embedded broker"), EmbeddedLock)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.release()
	// It lapsed (a database outage) and another idemd took it.
	ex := drv.Executor()
	if err := ex.LockRelease(ctx, &driver.LockReleaseParams{Name: EmbeddedLock, Owner: ls.owner}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if ok, err := ex.LockAcquire(ctx, &driver.LockAcquireParams{Name: EmbeddedLock, Owner: "elsewhere/7/beef/pid_[1]", Now: now, Until: now.Add(time.Hour)}); err != nil || !ok {
		t.Fatalf("take the lease: %v, %v", ok, err)
	}
	select {
	case err := <-a.fatal:
		if !strings.Contains(err.Error(), "taken by another idemd") {
			t.Errorf("fatal error %v", err)
		}
	case <-time.After(3 * embeddedLockTTL / 3 * 2):
		t.Fatal("no fatal failure after the lease was taken")
	}
}

// A worker that stops with an error (a consumer whose client failed) stops
// the process: Serve shuts down and returns the error (idemd exits 1 and
// its supervisor restarts it) instead of serving on without it, with
// /healthz green.
func TestWorkerStoppedIsFatal(t *testing.T) {
	t.Parallel()
	a := &App{
		cfg:     Config{ShutdownTimeout: 5 * time.Second},
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		handler: http.NotFoundHandler(),
		fatal:   make(chan error, 1),
		saga:    func(context.Context) error { return errors.New("kafka client closed") },
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(context.Background(), ln) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "order saga consumer stopped: kafka client closed") {
			t.Errorf("Serve = %v; want the saga consumer's failure", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve goes on after a worker stopped")
	}
}

// The whole shutdown is bounded by -shutdown-timeout: a worker that does
// not stop (a broker or database that stopped answering) is left behind
// (what it had in flight is published or delivered again at the next
// start), and Serve returns.
func TestShutdownBoundedWithHungWorker(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a := &App{
		cfg:     Config{ShutdownTimeout: 500 * time.Millisecond},
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		handler: http.NotFoundHandler(),
		fatal:   make(chan error, 1),
		consume: func(context.Context) error { <-release; return nil }, // ignores its context
	}
	_, cancel, done := serveInTest(t, a)
	time.Sleep(100 * time.Millisecond)
	m := stallmeter.Start(t)
	cancel()
	select {
	case <-done:
		if d, stalled := m.Elapsed(); d > 2*time.Second {
			t.Errorf("shutdown took %s (and the process stalled %s) with a 500ms timeout", d, stalled)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve waits for a worker that does not stop")
	}
}

// Until the outbox was redriven into a new embedded log, nothing is
// published into it, not even by the shutdown's flush: a key's new events
// would overtake its older ones not redriven yet.
func TestNoFlushIntoUnadoptedLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	cfg, err := ParseConfig([]string{"-db", "sqlite:" + filepath.Join(t.TempDir(), "x.db"), "-cleanup", "off", "-kafka-dir", dir},
		func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{"customer_id":1,"amount":"5.00","items":[{"sku":"A","quantity":1}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-1")
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("POST /v1/orders: %d %s", rec.Code, rec.Body)
	}
	if n, err := a.flush(ctx); n != 0 || err != nil {
		t.Errorf("flush into a log not adopted yet: %d published, %v; want none", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, embeddedMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker of a log not adopted: %v", err)
	}
}

// An idemd whose embedded-broker lease was taken publishes nothing more:
// its relay stops first and the shutdown does not flush the outbox into a
// log that is no longer the database's (no consumer would read it).
func TestLeaseTakenStopsPublishing(t *testing.T) {
	t.Parallel()
	var flushes atomic.Int32
	a := &App{
		cfg:     Config{ShutdownTimeout: 5 * time.Second},
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		handler: http.NotFoundHandler(),
		fatal:   make(chan error, 1),
		relay:   func(ctx context.Context) error { <-ctx.Done(); return nil },
		flush:   func(context.Context) (int, error) { flushes.Add(1); return 0, nil },
	}
	a.fail(fmt.Errorf("embedded broker: %w", errLeaseTaken))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(context.Background(), ln); !errors.Is(err, errLeaseTaken) {
		t.Errorf("Serve = %v; want the lease's failure", err)
	}
	if n := flushes.Load(); n != 0 {
		t.Errorf("%d flushes after the lease was taken; want none", n)
	}
}

// A client that stalls in the middle of its request at shutdown gets two
// thirds of -shutdown-timeout; its connection is then closed, and the rest
// of the bound goes to the relay, the consumers and the outbox flush,
// which still run. Serve returns an error (the request was cut off),
// within the bound.
func TestShutdownWithStalledClient(t *testing.T) {
	t.Parallel()
	var flushedAlive atomic.Int32
	a := &App{
		cfg: Config{ShutdownTimeout: 900 * time.Millisecond},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body) // the client never sends the rest
		}),
		fatal: make(chan error, 1),
		flush: func(ctx context.Context) (int, error) {
			if ctx.Err() == nil {
				flushedAlive.Add(1)
			}
			return 0, nil
		},
	}
	addr, cancel, done := serveInTest(t, a)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	m := stallmeter.Start(t)
	cancel()
	select {
	case err := <-done:
		if d, stalled := m.Elapsed(); d > 1500*time.Millisecond {
			t.Errorf("shutdown took %s (and the process stalled %s) with a 900ms timeout", d, stalled)
		}
		if err == nil || !strings.Contains(err.Error(), "in-flight requests") {
			t.Errorf("Serve: %v; want the cut-off requests reported", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve waits for a stalled client")
	}
	if flushedAlive.Load() == 0 {
		t.Error("the outbox was not flushed (with time left) after the stalled request was cut off")
	}
}

// serveInTest runs a.Serve on a loopback port until cancel; done receives
// what Serve returned.
func serveInTest(t *testing.T, a *App) (addr string, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	return ln.Addr().String(), cancel, served
}

// Closing waits for the database pool, which waits for a worker stuck on a
// database that stopped answering: idemd exits at -shutdown-timeout all
// the same instead of hanging until the kernel gives up on the socket.
func TestCloseBoundedWhenCloseHangs(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a := &App{close: func() { <-release }}
	m := stallmeter.Start(t)
	start := time.Now()
	if closeWithin(a, start.Add(300*time.Millisecond)) {
		t.Fatal("closeWithin reported a hanging Close as done")
	}
	ran, stalled := m.Elapsed()
	if d := time.Since(start); d < 250*time.Millisecond || ran > 2*time.Second {
		t.Errorf("closeWithin returned after %s (%s less the process's stalls of %s), want about 300ms", d, ran, stalled)
	}
	ok := &App{close: func() {}}
	if !closeWithin(ok, time.Now().Add(-time.Second)) {
		t.Error("a Close that returns at once, after the deadline, reported as hanging")
	}
}

// kfake seeds topics only into an empty log directory. A log of this
// database written with another -kafka-topic is refused with a message
// naming its topic (its unread events are there); a log from a first start
// that crashed before kfake saved its topics gets them created.
func TestEmbeddedLogWithoutTheTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "log")
	db := "sqlite:" + filepath.Join(t.TempDir(), "x.db")
	start := func(dir, db, topic string) (*App, error) {
		t.Helper()
		cfg, err := ParseConfig([]string{"-db", db, "-cleanup", "off", "-kafka-dir", dir, "-kafka-topic", topic},
			func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		return New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	a, err := start(dir, db, "topic.a")
	if err != nil {
		t.Fatal(err)
	}
	// The relay adopts the new log (writes its marker) before it runs.
	rctx, stop := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- a.relay(rctx) }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, embeddedMarker)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the log was not adopted")
		}
	}
	stop()
	<-relayDone
	a.Close()
	_, err = start(dir, db, "topic.b")
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "topic.a") {
		t.Fatalf("restart with another -kafka-topic: %v; want a ConfigError naming topic.a", err)
	}
	// A first start that crashed after kfake wrote meta.json, before its
	// topics: the log is new (no marker), its topics are created.
	crashed := filepath.Join(t.TempDir(), "log")
	if err := os.MkdirAll(crashed, 0o750); err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crashed, "meta.json"), meta, 0o640); err != nil {
		t.Fatal(err)
	}
	a, err = start(crashed, "sqlite:"+filepath.Join(t.TempDir(), "y.db"), "topic.c")
	if err != nil {
		t.Fatalf("start on a log holding only meta.json: %v", err)
	}
	a.Close()
}

// The lease taken while idemd is already shutting down (its renewals
// failed during a database outage, and another idemd took it) stops the
// publishing too: the shutdown's flushes do not publish into a log that is
// no longer the database's, and idemd exits 1.
func TestLeaseTakenDuringShutdownStopsPublishing(t *testing.T) {
	t.Parallel()
	var flushes atomic.Int32
	started := make(chan struct{})
	a := &App{
		cfg:   Config{ShutdownTimeout: 5 * time.Second},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		fatal: make(chan error, 1),
		relay: func(ctx context.Context) error { <-ctx.Done(); return nil },
		flush: func(context.Context) (int, error) { flushes.Add(1); return 0, nil },
	}
	a.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		time.Sleep(300 * time.Millisecond) // the shutdown starts meanwhile
		a.fail(fmt.Errorf("embedded broker: %w", errLeaseTaken))
	})
	addr, cancel, done := serveInTest(t, a)
	go func() {
		if res, err := http.Get("http://" + addr + "/x"); err == nil {
			_ = res.Body.Close()
		}
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, errLeaseTaken) {
			t.Errorf("Serve = %v; want the lease's failure", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if n := flushes.Load(); n != 0 {
		t.Errorf("%d flushes after the lease was taken; want none", n)
	}
}
