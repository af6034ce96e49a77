package app_test

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/driver/sqlitedriver"
	"github.com/idemkit/idem/internal/app"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/stallmeter"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testlog"
)

// run calls app.Run and returns its exit code and output.
func run(t *testing.T, args []string, env map[string]string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = app.Run(context.Background(), args, envOf(env), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestRunStartupFailures(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Close() })
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		code    int
		mention string
	}{
		{"bad flag", []string{"-port", "80"}, nil, 2, "-port"},
		{"bad addr", []string{"-addr", "8080"}, nil, 2, "listen address"},
		{"unknown scheme", nil, map[string]string{"IDEMD_DB": "mongodb://db"}, 2, "unknown database scheme"},
		{"sqlite in a missing directory", []string{"-addr", "127.0.0.1:0", "-db", "/nonexistent/dir/x.db"}, nil, 1, "/nonexistent/dir/x.db: directory /nonexistent/dir does not exist"},
		{"address in use", []string{"-addr", busy.Addr().String(), "-db", testdb.SQLitePath(t)}, nil, 1, "address already in use"},
		{"bad admin addr", []string{"-addr", "127.0.0.1:0", "-admin-addr", "metrics"}, nil, 2, "-admin-addr: bad listen address"},
		{"admin addr is addr", []string{"-addr", "127.0.0.1:8080", "-admin-addr", "127.0.0.1:8080"}, nil, 2, "ask for the same port"},
		{"admin address in use", []string{"-addr", "127.0.0.1:0", "-admin-addr", busy.Addr().String(), "-db", testdb.SQLitePath(t)}, nil, 1,
			"-admin-addr " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := run(t, tt.args, tt.env)
			if code != tt.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "idemd: ") ||
				!strings.Contains(stderr, tt.mention) || strings.Contains(stderr, "secret") {
				t.Errorf("stderr %q: want one line mentioning %q, no password", stderr, tt.mention)
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := run(t, []string{"-h"}, nil)
	if code != 0 || !strings.Contains(stdout, "-addr") || !strings.Contains(stdout, "IDEMD_DB") || stderr != "" ||
		!strings.Contains(stdout, "-kafka-sasl-password-file") || !strings.Contains(stdout, "IDEMD_KAFKA_SASL_PASSWORD (environment only)") {
		t.Errorf("-h: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

var listenRe = regexp.MustCompile(`^idemd listening on (http://\S+) with database (\S+) and kafka (embedded \(127\.0\.0\.1:\d+, log [^)]+\)|off|\S+)\n$`)

// Cancelling Run's context (the signal) lets an in-flight request finish,
// then Run returns 0.
func TestRunDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-db", "sqlite:" + path}, envOf(nil), stdout, stderr)
	}()
	var base string
	for deadline := time.Now().Add(60 * time.Second); base == ""; {
		if m := listenRe.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
			if m[2] != "sqlite:"+path {
				t.Errorf("listen line names database %q", m[2])
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line; stdout %q, stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Another process holds SQLite's write lock: the POST waits in BEGIN.
	other, err := sql.Open("sqlite", sqlitedriver.DSN(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Begin()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	wrote := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(orderBody(1, "5.00")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "drain")
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) }}))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		res.Body.Close()
		done <- result{status: res.StatusCode}
	}()
	// The request is sent, then reaches BEGIN and waits: 200ms of the
	// process's running time (a loaded machine stalls it for seconds,
	// and a fixed sleep then signalled before idemd read the request).
	select {
	case <-wrote:
	case r := <-done:
		t.Fatalf("the request ended before it was sent: %d, %v", r.status, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the request was not sent within 30 s")
	}
	for m := stallmeter.Start(t); ; {
		if ran, _ := m.Elapsed(); ran >= 200*time.Millisecond {
			break
		}
	}
	cancel() // SIGTERM
	select {
	case code := <-exited:
		t.Fatalf("Run returned %d with a request in flight", code)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("new connection accepted during shutdown")
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.status != http.StatusCreated {
		t.Errorf("in-flight request: %d, %v; want 201", r.status, r.err)
	}
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit code %d, want 0; stderr %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	// Each step logged, in order.
	logs, at := stderr.String(), 0
	for _, step := range []string{"shutdown: 1/3", "shutdown: 2/3", "shutdown: 3/3", `"msg":"stopped"`,
		"shutdown: Kafka client, embedded broker and database closed"} {
		i := strings.Index(logs[at:], step)
		if i < 0 {
			t.Fatalf("stderr lacks %q after offset %d: %s", step, at, logs)
		}
		at += i
	}
	// The order's event left the outbox before idemd exited.
	var unpublished int
	if err := other.QueryRow(`SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 {
		t.Errorf("%d events left in the outbox at exit, want 0 (flushed on shutdown)", unpublished)
	}
}

// idemd runs the retention sweep on its -cleanup schedule: an expired
// idempotency record is deleted, a live one is kept, and /metrics counts it.
func TestRunSweepsExpiredRecords(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-db", path, "-cleanup", "@every 1s"}, envOf(nil), stdout, stderr)
	}()
	var base string
	for deadline := time.Now().Add(60 * time.Second); base == ""; time.Sleep(5 * time.Millisecond) {
		if m := listenRe.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line; stdout %q, stderr %q", stdout.String(), stderr.String())
		}
	}
	for i, key := range []string{"expired", "live"} {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader(paymentBody("ext-sweep-"+key)))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("POST %d: status %d", i, res.StatusCode)
		}
	}
	db, err := sql.Open("sqlite", sqlitedriver.DSN(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE idempotency_record SET expires_at = ? WHERE idempotency_key = 'expired'`,
		time.Now().Add(-time.Hour).UnixMicro()); err != nil {
		t.Fatal(err)
	}
	deletedMetric := regexp.MustCompile(`(?m)^idemd_cleanup_deleted_rows_total\{table="idempotency_record"\} 1$`)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if deletedMetric.Match(body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sweep deleted the expired record; metrics:\n%s\nstderr %s", grepLines(string(body), "idemd_cleanup"), stderr.String())
		}
	}
	var keys []string
	rows, err := db.Query(`SELECT idempotency_key FROM idempotency_record`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "live" {
		t.Errorf("records after the sweep: %q; want only \"live\"", keys)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("exit code %d; stderr %s", code, stderr.String())
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// blackHole returns the address of a listener that accepts connections and
// never answers: a database that does not answer yet (or any more).
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// A signal while idemd starts (here: while it waits for a database that
// does not answer; a Kubernetes pod deleted during its start) stops it at
// once, as asked: exit 0 and a line that says so. It used to exit 1 with
// "database ... unreachable: context canceled", blaming the database.
func TestRunStoppedDuringStartup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testlog.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-kafka", "off",
			"-db", "postgres://postgres@" + blackHole(t) + "/test?sslmode=disable"}, envOf(nil), &stdout, &stderr)
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case code := <-exited:
		t.Fatalf("Run returned %d before the signal; stderr %q", code, stderr.String())
	default:
	}
	m := stallmeter.Start(t)
	cancel() // SIGTERM
	select {
	case code := <-exited:
		if took, stalled := m.Elapsed(); took > 2*time.Second {
			t.Errorf("Run returned %v after the signal (and the process stalled %s), want at once", took, stalled)
		}
		if code != 0 {
			t.Errorf("exit code %d, want 0 (stopped as asked)", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20 s of the signal (the start-up bound is 30 s)")
	}
	if stdout.String() != "" {
		t.Errorf("stdout %q, want nothing (idemd never listened)", stdout.String())
	}
	if e := stderr.String(); !strings.Contains(e, "stopped during start-up by a signal") || strings.Contains(e, "unreachable") ||
		strings.Contains(e, "context canceled") {
		t.Errorf("stderr %q: want a line saying idemd stopped during start-up, not blaming the database", e)
	}
}

// forwardWhen returns an address that refuses connections until open
// (polled) reports true, then forwards them to target: a database or a
// broker that starts after idemd (a sidecar proxy, a cluster starting
// up).
func forwardWhen(t *testing.T, target string, open func() bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // refused until then
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	wg.Go(func() {
		for !open() {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listen again on %s: %v", addr, err)
			return
		}
		go func() { <-stop; _ = ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	})
	return addr
}

// A database that does not accept connections yet when idemd starts (its
// sidecar proxy starting beside it, the cluster coming up) is waited for
// within the start-up bound, retrying with backoff: idemd used to exit 1 at
// the first refused connection, and Kubernetes restarted it with a growing
// back-off (CrashLoopBackOff, up to 5 min) after the database was back.
func TestRunWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	dbArg, _ := dbSetting(t, app.Postgres)
	u, err := url.Parse(dbArg)
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	// Refused until idemd retried (a fixed delay was over before idemd
	// first tried on a loaded machine).
	u.Host = forwardWhen(t, u.Host, func() bool {
		return strings.Contains(stderr.String(), "database unreachable at start-up; retrying")
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-kafka", "off", "-db", u.String()}, envOf(nil), stdout, stderr)
	}()
	for deadline := time.Now().Add(60 * time.Second); listenRe.FindStringSubmatch(stdout.String()) == nil; time.Sleep(10 * time.Millisecond) {
		select {
		case code := <-exited:
			t.Fatalf("Run returned %d before the database accepted connections; stderr %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line 60 s after the start; stderr %s", stderr.String())
		}
	}
	if e := stderr.String(); !strings.Contains(e, "database unreachable at start-up; retrying") || !strings.Contains(e, "connection refused") {
		t.Errorf("stderr lacks the retries and their error: %s", e)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("exit code %d; stderr %s", code, stderr.String())
	}
}

// A database still unreachable at the end of the start-up bound stops
// idemd (exit 1) with the last failure, which says why, and how long it
// was tried: a refused connection, or a host name that does not resolve
// (yet: a StatefulSet's database pod gets its DNS name only once ready),
// which used to stop idemd at once.
func TestRunDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, host, shown, why string }{
		{"refused", "127.0.0.1:1", `127\.0\.0\.1:1`, "connection refused"},
		{"unresolved", "db.idemd-test.invalid:5432", `db\.idemd-test\.invalid:5432`, `lookup db\.idemd-test\.invalid`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Tries at 0, 0.25, 0.75, 1.75 and 3.75 s: at least 3 in
			// the bound unless the process stood still for 2 s or more
			// (with a 2 s bound, 4 tries, a stall of 1.25 s left 2).
			const bound = 4 * time.Second
			var stdout, stderr testlog.Buffer
			m := stallmeter.Start(t)
			start := time.Now()
			code := app.RunWith(context.Background(), []string{"-addr", "127.0.0.1:0", "-kafka", "off",
				"-db", "postgres://postgres:secret@" + c.host + "/test?connect_timeout=5"}, envOf(nil), &stdout, &stderr,
				app.WithStartTimeout(app.Options{}, bound))
			took := time.Since(start)
			ran, stalled := m.Elapsed()
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr %s", code, stderr.String())
			}
			if took < bound || ran > bound+3*time.Second {
				t.Errorf("Run returned after %v (%v less the process's stalls of %v), want the start-up bound (%v) of retries; stderr %s",
					took, ran, stalled, bound, stderr.String())
			}
			if stdout.String() != "" {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			last := lines[len(lines)-1]
			if !regexp.MustCompile(`^idemd: database postgres://postgres:xxxxx@` + c.shown + `/test\?connect_timeout=5 unreachable: .*` +
				c.why + `.* \(tried [3-9] times in [0-9.]+s\)$`).MatchString(last) {
				t.Errorf("last line %q: want the database unreachable, why, and how long it was tried", last)
			}
			if retries := strings.Count(stderr.String(), "database unreachable at start-up; retrying"); retries < 3 || retries != len(lines)-1 {
				t.Errorf("%d retry lines among %d: want one per failed try before the last line:\n%s", retries, len(lines), stderr.String())
			}
			if strings.Contains(stderr.String(), "secret") {
				t.Errorf("stderr shows the password: %s", stderr.String())
			}
		})
	}
}

// A Kafka cluster that does not accept connections yet when idemd starts
// (the cluster coming up beside it) is waited for within the start-up
// bound, as the database is: idemd used to stop at once (exit 1, "kafka
// ... unreachable (checked at start-up, for up to 10s)" 0.3 s after a
// refused connection).
func TestRunWaitsForKafka(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.New(t)
	topic := kafkatest.Name("idemd-late")
	cluster.CreateTopic(t, topic, 1)
	cluster.CreateTopic(t, topic+".dlq", 1)
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	// Refused until idemd retried (a fixed delay was over before idemd
	// first tried on a loaded machine).
	seed := forwardWhen(t, cluster.Seeds[0], func() bool {
		return strings.Contains(stderr.String(), "kafka unreachable at start-up; retrying")
	})
	dbArg, _ := dbSetting(t, app.Postgres)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	go func() {
		exited <- app.Run(ctx, []string{"-addr", "127.0.0.1:0", "-db", dbArg, "-kafka", seed, "-kafka-topic", topic}, envOf(nil), stdout, stderr)
	}()
	for deadline := time.Now().Add(60 * time.Second); listenRe.FindStringSubmatch(stdout.String()) == nil; time.Sleep(10 * time.Millisecond) {
		select {
		case code := <-exited:
			t.Fatalf("Run returned %d before Kafka accepted connections; stderr %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listen line 60 s after the start; stderr %s", stderr.String())
		}
	}
	if e := stderr.String(); !strings.Contains(e, "kafka unreachable at start-up; retrying") || !strings.Contains(e, "connection refused") {
		t.Errorf("stderr lacks the retries and their error: %s", e)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("exit code %d; stderr %s", code, stderr.String())
	}
}
